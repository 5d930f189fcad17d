"""The ``replay`` backend: time and power per (b, f) from a measured table (CSV or JSON).

Published measurements or a user's own earlier profiles drive profiling and training
accounting: ``fn`` of every step runs for real (the model really trains), while the step's
device time, energy and peak power come from the table's row for (batch size, locked
knob value), on an emulated clock like the digital twin's. The knob is the GPU frequency in
MHz (column "freq_mhz", the default) or a GPU power limit in W (``power_limit_w``, as NVML GPUs
and Zeus traces have); the device's ``knob_values`` / ``set_knob_value`` then carry the
knob's values. The file format is documented in ``configs/replay/README.md``.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from fl_client.devices.base import (
    GPU_FREQ_MHZ,
    KNOBS,
    DeviceError,
    DeviceInfo,
    InvalidFrequencyError,
    Knob,
    Workload,
    knob_for,
    level_below,
)
from fl_client.devices.descriptors import descriptor_b1_bands, descriptor_board_sensor
from fl_client.devices.emulated import EmulatedDevice, EmulatedMeter
from fl_client.devices.guard import CapGuard
from fl_client.devices.sensors import REPLAY_SENSOR

BACKEND = "replay"
#: Written into JSON tables; /2 added the knob column (power_limit_w) and
#: peak_power_sigma_w. Tables marked /1, or not marked, still load.
FORMAT = "powerfl-replay/2"
FORMATS = ("powerfl-replay/1", FORMAT)
#: Row columns, the knob's second: "freq_mhz" by default, or another of ``KNOBS``.
ROW_KEYS = ("batch_size", "freq_mhz", "time_per_step_s", "peak_power_w", "avg_power_w")
SIGMA_KEY = "peak_power_sigma_w"
GROUP_KEYS = ("device", "model", "input_shape")
META_KEYS = ("power_rail", "memory_bytes", "source", "knob")


class ReplayFormatError(DeviceError, ValueError):
    """A replay table that cannot be read; the message names the file, row and key."""


def _norm(key: str) -> str:
    return key.strip().lower().replace("-", "_")


def parse_shape(value: object, where: str) -> tuple[int, ...] | None:
    """``[3, 32, 32]``, ``"3x32x32"`` or empty (any shape)."""
    if value is None or value == "":
        return None
    try:
        if isinstance(value, str):
            parts = [p for p in value.lower().replace("×", "x").split("x") if p.strip()]
            return tuple(int(p) for p in parts)
        if isinstance(value, list | tuple):
            return tuple(int(v) for v in value)
    except ValueError:
        pass
    raise ReplayFormatError(
        f"{where}: input_shape: expected e.g. 3x32x32 or [3, 32, 32], got {value!r}"
    )


@dataclass(frozen=True)
class ReplayRow:
    """One measured (b, knob value) point.

    ``knob_value`` holds the value of the table's knob: MHz for the GPU frequency, W for a
    power limit, read from the column ``knob.key``. ``peak_power_sigma_w`` is the standard
    deviation of the per-step peak powers, None when the table does not give it.
    """

    batch_size: int
    knob_value: float
    time_per_step_s: float
    peak_power_w: float
    avg_power_w: float
    peak_power_sigma_w: float | None = None

    @property
    def time_per_sample_s(self) -> float:
        return self.time_per_step_s / self.batch_size

    @classmethod
    def parse(cls, raw: Mapping[str, Any], where: str, knob: Knob = GPU_FREQ_MHZ) -> ReplayRow:
        """One row; its knob value is read from the column ``knob.key``."""
        data = {_norm(k): v for k, v in raw.items() if v not in (None, "")}

        def number(key: str, zero_ok: bool = False) -> float:
            if key not in data:
                raise ReplayFormatError(f"{where}: {key}: missing")
            try:
                value = float(data[key])
            except (TypeError, ValueError):
                raise ReplayFormatError(f"{where}: {key}: not a number: {data[key]!r}") from None
            if not (math.isfinite(value) and (value > 0 or (zero_ok and value == 0))):
                bound = "≥ 0" if zero_ok else "> 0"
                raise ReplayFormatError(f"{where}: {key}: must be {bound}, got {data[key]!r}")
            return value

        batch_size = number("batch_size")
        if batch_size != int(batch_size):
            raise ReplayFormatError(f"{where}: batch_size: must be an integer, got {batch_size}")
        if "time_per_step_s" in data:
            step_s = number("time_per_step_s")
        elif "time_per_sample_s" in data:
            step_s = number("time_per_sample_s") * batch_size
        else:
            raise ReplayFormatError(f"{where}: time_per_step_s or time_per_sample_s: missing")
        # σ of 0 is a valid spread (every step peaked alike); an empty cell: not recorded
        sigma = number(SIGMA_KEY, zero_ok=True) if SIGMA_KEY in data else None
        row = cls(
            int(batch_size),
            number(knob.key),
            step_s,
            number("peak_power_w"),
            number("avg_power_w"),
            sigma,
        )
        if row.avg_power_w > row.peak_power_w * (1 + 1e-9):
            raise ReplayFormatError(
                f"{where}: avg_power_w {row.avg_power_w} above peak_power_w {row.peak_power_w}"
            )
        return row


def table_knob(meta: Mapping[str, Any], columns: set[str], where: str) -> Knob:
    """The knob a table is indexed by: its ``knob`` field, else the one knob column it has
    ("freq_mhz" when it has none, so that the row says what is missing)."""
    present = [KNOBS[k] for k in KNOBS if k in columns]
    named = meta.get("knob")
    if named not in (None, ""):
        try:
            knob = knob_for(str(named))
        except ValueError as err:
            raise ReplayFormatError(f"{where}: {err}") from None
        if present and knob not in present:
            raise ReplayFormatError(
                f"{where}: knob: {knob.key} is named but the rows give {present[0].key}"
            )
        return knob
    if len(present) > 1:
        raise ReplayFormatError(
            f"{where}: the rows give {' and '.join(k.key for k in present)}; a table has one "
            "knob (name it with a knob field)"
        )
    return present[0] if present else GPU_FREQ_MHZ


class ReplayGrid(NamedTuple):
    """A replay table as arrays (``ReplayTable.grid``); NaN where a cell is absent."""

    batch_sizes: tuple[int, ...]
    knob_values: tuple[float, ...]
    time_per_sample_s: npt.NDArray[np.float64]
    peak_power_w: npt.NDArray[np.float64]
    avg_power_w: npt.NDArray[np.float64]
    peak_power_sigma_w: npt.NDArray[np.float64]
    knob: Knob


@dataclass(frozen=True)
class ReplayTable:
    """Measured rows of one (device, model, input shape), indexed by (b, ``knob`` value)."""

    device: str
    model: str
    input_shape: tuple[int, ...] | None
    rows: tuple[ReplayRow, ...]
    power_rail: str = ""
    memory_bytes: int | None = None
    source: str = ""
    knob: Knob = GPU_FREQ_MHZ
    _index: dict[tuple[int, float], ReplayRow] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for row in self.rows:
            key = (row.batch_size, round(row.knob_value, 3))
            if key in self._index:
                raise ReplayFormatError(
                    f"replay table {self.device}/{self.model}: two rows for "
                    f"batch_size={row.batch_size}, {self.knob.key}={row.knob_value:g}"
                )
            self._index[key] = row

    @property
    def knob_values(self) -> tuple[float, ...]:
        """The knob's values in the table, ascending (MHz for the GPU frequency)."""
        return tuple(sorted({r.knob_value for r in self.rows}))

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(sorted({r.batch_size for r in self.rows}))

    def matches(self, workload: Workload) -> bool:
        return self.model == workload.model_name and (
            self.input_shape is None or self.input_shape == tuple(workload.input_shape)
        )

    def row(self, batch_size: int, knob_value: float) -> ReplayRow:
        found = self._index.get((batch_size, round(knob_value, 3)))
        if found is None:
            at_f = sorted(r.batch_size for r in self.rows if abs(r.knob_value - knob_value) < 1e-3)
            k = self.knob
            raise DeviceError(
                f"replay: no row for batch_size={batch_size} at {k.key}={knob_value:g} in the "
                f"{self.device}/{self.model} table; at that {k.label} it has batch sizes "
                f"{at_f or 'none'}, {k.label} values "
                f"{', '.join(f'{f:g}' for f in self.knob_values)} {k.unit}"
            )
        return found

    def grid(self, batch_sizes: Sequence[int] | None = None) -> ReplayGrid:
        """The table as |B| × |F| arrays, the layout of the profiler's LUT and the selector.

        Rows follow ``batch_sizes`` (default: the table's), columns the knob's values; a
        (b, value) the table lacks is NaN (not profiled), and so is σ where not given.
        """
        b_list = tuple(self.batch_sizes if batch_sizes is None else batch_sizes)
        values = self.knob_values
        shape = (len(b_list), len(values))
        time_s, peak_w, avg_w, sigma_w = (np.full(shape, np.nan) for _ in range(4))
        col = {round(v, 3): j for j, v in enumerate(values)}
        row = {b: i for i, b in enumerate(b_list)}
        for r in self.rows:
            i = row.get(r.batch_size)
            if i is None:
                continue
            j = col[round(r.knob_value, 3)]
            time_s[i, j] = r.time_per_sample_s
            peak_w[i, j], avg_w[i, j] = r.peak_power_w, r.avg_power_w
            if r.peak_power_sigma_w is not None:
                sigma_w[i, j] = r.peak_power_sigma_w
        return ReplayGrid(b_list, values, time_s, peak_w, avg_w, sigma_w, self.knob)

    def to_json(self) -> dict[str, Any]:
        with_sigma = any(r.peak_power_sigma_w is not None for r in self.rows)
        return {
            "format": FORMAT,
            "device": self.device,
            "model": self.model,
            "input_shape": list(self.input_shape) if self.input_shape else None,
            "power_rail": self.power_rail,
            "memory_bytes": self.memory_bytes,
            "source": self.source,
            "knob": self.knob.key,
            "rows": [
                {
                    "batch_size": r.batch_size,
                    self.knob.key: r.knob_value,
                    "time_per_step_s": r.time_per_step_s,
                    "peak_power_w": r.peak_power_w,
                    "avg_power_w": r.avg_power_w,
                    **({SIGMA_KEY: r.peak_power_sigma_w} if with_sigma else {}),
                }
                for r in sorted(self.rows, key=lambda r: (r.batch_size, r.knob_value))
            ],
        }

    def row_keys(self) -> tuple[str, ...]:
        """The columns this table writes: ``ROW_KEYS`` with its knob, σ when it has any."""
        keys = (ROW_KEYS[0], self.knob.key, *ROW_KEYS[2:])
        with_sigma = any(r.peak_power_sigma_w is not None for r in self.rows)
        return (*keys, SIGMA_KEY) if with_sigma else keys


def _table(
    meta: Mapping[str, Any], rows: Sequence[ReplayRow], where: str, knob: Knob = GPU_FREQ_MHZ
) -> ReplayTable:
    for key in ("device", "model"):
        if not str(meta.get(key, "")).strip():
            raise ReplayFormatError(f"{where}: {key}: missing")
    if not rows:
        raise ReplayFormatError(f"{where}: rows: the table has no rows")
    memory = meta.get("memory_bytes")
    try:
        memory_bytes = int(memory) if memory not in (None, "") else None
    except (TypeError, ValueError):
        raise ReplayFormatError(f"{where}: memory_bytes: not an integer: {memory!r}") from None
    return ReplayTable(
        device=str(meta["device"]).strip(),
        model=str(meta["model"]).strip(),
        input_shape=parse_shape(meta.get("input_shape"), where),
        rows=tuple(rows),
        power_rail=str(meta.get("power_rail") or ""),
        memory_bytes=memory_bytes,
        source=str(meta.get("source") or ""),
        knob=knob,
    )


def _from_json(path: Path) -> list[ReplayTable]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ReplayFormatError(f"{path}: not valid JSON: {err}") from None
    items = data.get("tables", [data]) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ReplayFormatError(f"{path}: expected an object with rows, or a list of them")
    tables = []
    for t, item in enumerate(items):
        where = f"{path} table #{t + 1}"
        if not isinstance(item, dict) or not isinstance(item.get("rows"), list):
            raise ReplayFormatError(f"{where}: rows: expected a list of row objects")
        meta = {_norm(k): v for k, v in item.items() if k != "rows"}
        fmt = meta.get("format")
        if fmt not in (None, "", *FORMATS):
            raise ReplayFormatError(f"{where}: format: {fmt!r} is not one of {', '.join(FORMATS)}")
        columns = {_norm(k) for r in item["rows"] if isinstance(r, dict) for k in r}
        knob = table_knob(meta, columns, where)
        rows = [
            ReplayRow.parse(r, f"{where} row #{i + 1}", knob) for i, r in enumerate(item["rows"])
        ]
        tables.append(_table(meta, rows, where, knob))
    return tables


def _from_csv(path: Path) -> list[ReplayTable]:
    meta: dict[str, Any] = {}
    lines: list[str] = []
    line_numbers: list[int] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("#"):  # "# key: value" lines carry table-wide metadata
            key, sep, value = stripped.lstrip("#").partition(":")
            if sep and _norm(key) in (*GROUP_KEYS, *META_KEYS):
                meta[_norm(key)] = value.strip()
        elif stripped:
            lines.append(line)
            line_numbers.append(number)
    reader = csv.DictReader(lines)
    knob = table_knob(meta, {_norm(k) for k in reader.fieldnames or ()}, str(path))
    groups: dict[tuple[str, ...], tuple[dict[str, Any], list[ReplayRow]]] = {}
    for i, raw in enumerate(reader):
        where = f"{path} line {line_numbers[i + 1]}"
        row = {_norm(k): (v.strip() if isinstance(v, str) else v) for k, v in raw.items() if k}
        group_meta = {**meta, **{k: row[k] for k in GROUP_KEYS if row.get(k)}}
        group = tuple(str(group_meta.get(k, "")) for k in GROUP_KEYS)
        groups.setdefault(group, (group_meta, []))[1].append(ReplayRow.parse(row, where, knob))
    if not groups:
        raise ReplayFormatError(f"{path}: rows: the table has no rows")
    return [_table(m, rows, str(path), knob) for m, rows in groups.values()]


def load_replay_tables(path: str | os.PathLike[str]) -> list[ReplayTable]:
    """Every table in a ``.json`` or ``.csv`` replay file."""
    p = Path(path).expanduser()
    if not p.is_file():
        what = "is a folder, not a file" if p.is_dir() else "file not found"
        raise ReplayFormatError(f"replay-table: {what}: {p}")
    if p.suffix.lower() == ".json":
        return _from_json(p)
    if p.suffix.lower() == ".csv":
        return _from_csv(p)
    raise ReplayFormatError(f"replay-table: {p}: expected a .json or .csv file")


def save_replay_table(table: ReplayTable, path: str | os.PathLike[str]) -> Path:
    """Write one table as JSON (or CSV with ``# key: value`` metadata lines) by suffix; its
    folder is created when missing."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix.lower() == ".csv":
        data = table.to_json()
        head = [f"# {k}: {data[k]}" for k in ("device", "model", *META_KEYS) if data[k]]
        if table.input_shape:
            head.append("# input_shape: " + "x".join(map(str, table.input_shape)))
        keys = table.row_keys()
        body = [",".join(keys)] + [
            ",".join(_csv_cell(r.get(k)) for k in keys) for r in data["rows"]
        ]
        p.write_text("\n".join(head + body) + "\n")
    else:
        p.write_text(json.dumps(table.to_json(), indent=2) + "\n")
    return p


def _csv_cell(value: object) -> str:
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


class ReplayMeter(EmulatedMeter):
    """Runs each step for real; accounts its time and power from the table (with the cap
    guard, as on the digital twin: ``EmulatedMeter``)."""

    def __init__(
        self, device: ReplayDevice, table: ReplayTable, guard: CapGuard | None = None
    ) -> None:
        super().__init__(device, guard)
        self._table = table

    def step(self, batch_size: int, fn: Callable[[], object]) -> None:
        row = self._table.row(batch_size, self._device.current_knob_value())
        fn()
        self.account(batch_size, row.time_per_step_s, row.avg_power_w, row.peak_power_w)


def _twin_memory_bytes(kind: str) -> int | None:
    try:
        from fl_client.devices.descriptors import load_device_spec

        value = getattr(load_device_spec(kind), "memory_bytes", None)
    except Exception:  # no twin for this kind (or no twin module): the table must say
        return None
    return int(value) if value else None


class ReplayDevice(EmulatedDevice):
    """A device whose time and power come from measured tables, on an emulated clock.

    Its cap guard (``cap_guard``) steps the locked frequency down to the table's next lower
    frequency; that (b, f) must be in the table too. ``knob_values`` (ascending) and
    ``set_knob_value`` carry the table's knob: MHz for the GPU frequency (see ``knob``).
    """

    def __init__(self, tables: Sequence[ReplayTable], kind: str = "") -> None:
        devices = sorted({t.device for t in tables})
        if not kind and len(devices) > 1:
            raise DeviceError(f"replay: the table holds devices {devices}; name one as kind")
        kind = kind or (devices[0] if devices else "")
        self._tables = [t for t in tables if t.device == kind]
        if not self._tables:
            raise DeviceError(
                f"device: the replay table has no rows for {kind!r}; it has {', '.join(devices)}"
            )
        knobs = sorted({t.knob.key for t in self._tables})
        if len(knobs) > 1:
            raise DeviceError(
                f"replay: the tables of {kind!r} mix knobs ({', '.join(knobs)}); one device has "
                "one knob"
            )
        self._knob = self._tables[0].knob
        memory = next((t.memory_bytes for t in self._tables if t.memory_bytes), None)
        memory = memory or _twin_memory_bytes(kind)
        if not memory:
            raise DeviceError(
                f"replay: memory_bytes: missing for {kind!r} (no digital twin to take it "
                "from); add it to the table"
            )
        freqs = tuple(sorted({f for t in self._tables for f in t.knob_values}))
        self._info = DeviceInfo(
            kind=kind,
            backend=BACKEND,
            knob_values=freqs,
            memory_bytes=memory,
            power_rail=next((t.power_rail for t in self._tables if t.power_rail), "replay"),
            b1_bands=descriptor_b1_bands(kind),
            sensor=REPLAY_SENSOR,
            board_sensor=descriptor_board_sensor(kind),
        )
        self._knob_value_set: float | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], kind: str = "") -> ReplayDevice:
        return cls(load_replay_tables(path), kind)

    @property
    def knob(self) -> Knob:
        """What ``knob_values`` and ``set_knob_value`` carry: frequency or power limit."""
        return self._knob

    @property
    def tables(self) -> tuple[ReplayTable, ...]:
        return tuple(self._tables)

    def current_knob_value(self) -> float:
        return self._knob_value_set if self._knob_value_set is not None else self.knob_values[-1]

    def set_knob_value(self, knob_value: float) -> None:
        match = next((f for f in self.knob_values if abs(f - knob_value) < 1e-3), None)
        if match is None:
            k = self._knob
            raise InvalidFrequencyError(
                f"{k.config_key}: {knob_value:g} {k.unit} is not in the replay table of "
                f"{self._info.kind}; allowed: {', '.join(f'{f:g}' for f in self.knob_values)}"
            )
        self._knob_value_set = match

    def restore(self) -> None:
        self._knob_value_set = None

    def step_down_knob_value(self) -> float | None:
        """Set the next lower knob value; None when not set or already the lowest."""
        lower = level_below(self.knob_values, self._knob_value_set)
        if lower is not None:
            self._knob_value_set = lower
        return lower

    def table_for(self, workload: Workload) -> ReplayTable:
        for table in self._tables:
            if table.matches(workload):
                return table
        have = ", ".join(
            f"{t.model} {'x'.join(map(str, t.input_shape)) if t.input_shape else '(any shape)'}"
            for t in self._tables
        )
        raise DeviceError(
            f"replay: no table for model {workload.model_name!r} at input shape "
            f"{'x'.join(map(str, workload.input_shape))} on {self._info.kind}; it has: {have}"
        )

    @contextmanager
    def measure(self, workload: Workload) -> Iterator[ReplayMeter]:
        yield ReplayMeter(self, self.table_for(workload), self._new_guard())

    def describe(self) -> dict[str, Any]:
        """What ``powerfl devices`` shows; the knob's values under its own key and unit
        (``gpu-freqs-mhz`` / ``cur-freq-mhz``, or ``power-limits-w`` / ``power-limit-w``)."""
        freq = self._knob is GPU_FREQ_MHZ
        return {
            "kind": self._info.kind,
            "backend": BACKEND,
            "gpu-freqs-mhz" if freq else self._knob.values_key: list(self.knob_values),
            "cur-freq-mhz" if freq else "power-limit-w": self.current_knob_value(),
            "knob": self._knob.key,
            "knob-unit": self._knob.unit,
            "memory-bytes": self._info.memory_bytes,
            "power-rail": self._info.power_rail,
            "tables": [
                {
                    "model": t.model,
                    "input-shape": t.input_shape,
                    "rows": len(t.rows),
                    "source": t.source,
                }
                for t in self._tables
            ],
        }
