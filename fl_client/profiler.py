"""On-device profiling of LUT_time / LUT_power per (batch size, GPU frequency), with a disk cache.

Paper §4.1: for each profiled (b, f) lock the GPU at f, run a few real minibatches of the
model at b (warm-up discarded) and record time per sample and peak power. Under a known
P_max only the cells that matter are profiled (efficient mode). Tables are cached per
(device kind, backend, model, input shape, B, cap). No Flower import.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from fl_client.devices.base import Device, Measurement, Workload
from fl_client.selector import (
    validate_batch_sizes,
    validate_freqs_mhz,
    validate_p_max_w,
    validate_tables,
)

log = logging.getLogger(__name__)

LUT_FORMAT = "powerfl-lut"
LUT_VERSION = 1
#: How much of the (b, f) grid a LUT covers; see ``LUT.grid``.
GRIDS = ("full", "efficient", "highest", "on-demand")

FloatArray = npt.NDArray[np.float64]
StepFactory = Callable[[int], Callable[[], object]]


class LUTFormatError(ValueError):
    """A LUT file or record is malformed or does not fit together."""


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, eq=False)
class LUT:
    """The profiled lookup tables of one (device, backend, model, input shape).

    Rows follow ``batch_sizes``, columns ``freqs_mhz``; NaN marks a cell that was not
    profiled (efficient mode), in all three tables at once. Arrays are read-only copies.

    Attributes
    ----------
    device_kind : str
        e.g. ``"jetson-nano"``.
    backend : str
        ``"simulated"``, ``"jetson"``, ``"nvml"`` or ``"replay"``.
    model_name : str
        The workload's model.
    input_shape : tuple of int
        Shape of one sample.
    batch_sizes : tuple of int
        B, strictly ascending.
    freqs_mhz : tuple of float
        The device's frequency table in MHz, strictly ascending.
    time_per_sample_s : ndarray, shape (|B|, |F|)
        Training time per sample in seconds (LUT_time).
    peak_power_w : ndarray, shape (|B|, |F|)
        Highest power sample in W (LUT_power, what Eq. 4 compares with P_max).
    avg_power_w : ndarray, shape (|B|, |F|)
        Energy / time of the measured steps in W.
    p_max_w : float or None
        The cap efficient mode profiled for; None for a full grid.
    profile_time_s : float
        Device time the profiling took (warm-up and measured steps, frequency changes).
    profile_energy_j : float
        Energy of the warm-up and measured steps.
    created_utc : str
        ISO-8601 UTC time the tables were made.
    warmup_steps, steps : int
        Steps discarded and measured per cell.
    grid : str
        ``full`` (every cell; serves any cap), ``efficient`` (paper §4.1 under
        ``p_max_w``) or ``highest`` (no cap: each b at the highest frequency only, the
        cell Eq. 4 picks per b when nothing is infeasible) or ``on-demand`` (no cap: single
        cells measured when something needed them, e.g. pacing below f*; never selected
        from on its own). Default: ``full`` without a cap, ``efficient`` with one.
    """

    device_kind: str
    backend: str
    model_name: str
    input_shape: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    freqs_mhz: tuple[float, ...]
    time_per_sample_s: FloatArray
    peak_power_w: FloatArray
    avg_power_w: FloatArray
    p_max_w: float | None = None
    profile_time_s: float = 0.0
    profile_energy_j: float = 0.0
    created_utc: str = field(default_factory=_utc_now)
    warmup_steps: int = 1
    steps: int = 3
    grid: str = ""

    def __post_init__(self) -> None:
        try:
            b = validate_batch_sizes(list(self.batch_sizes))
            f = validate_freqs_mhz(list(self.freqs_mhz))
            cap = validate_p_max_w(self.p_max_w)
            time_s, peak_w = validate_tables(
                self.time_per_sample_s, self.peak_power_w, len(b), len(f)
            )
            # Average power has the same cells and the same rules as peak power.
            avg_w = validate_tables(time_s, self.avg_power_w, len(b), len(f))[1]
        except ValueError as err:
            raise LUTFormatError(str(err)) from None
        grid = self.grid or ("full" if cap is None else "efficient")
        if grid not in GRIDS:
            raise LUTFormatError(f"grid: unknown value {grid!r}; allowed: {', '.join(GRIDS)}")
        if grid == "full" and (cap is not None or np.isnan(time_s).any()):
            raise LUTFormatError("a full-grid LUT needs p-max-w none and every cell profiled")
        if grid == "efficient" and cap is None:
            raise LUTFormatError("an efficient-mode LUT needs the cap it was made for (p-max-w)")
        if grid in ("highest", "on-demand") and cap is not None:
            raise LUTFormatError(f"a {grid} LUT is made without a cap (p-max-w none)")
        object.__setattr__(self, "grid", grid)
        shape = tuple(int(d) for d in self.input_shape)
        if not shape or any(d < 1 for d in shape):
            raise LUTFormatError(f"input-shape: must be positive sizes; got {self.input_shape}")
        for name in ("profile_time_s", "profile_energy_j"):
            value = float(getattr(self, name))
            if not math.isfinite(value) or value < 0:
                raise LUTFormatError(f"{name}: must be a finite number ≥ 0; got {value}")
            object.__setattr__(self, name, value)
        if self.warmup_steps < 0 or self.steps < 1:
            raise LUTFormatError(
                f"warmup-steps / steps: need ≥ 0 / ≥ 1; got {self.warmup_steps} / {self.steps}"
            )
        object.__setattr__(self, "batch_sizes", tuple(b))
        object.__setattr__(self, "freqs_mhz", tuple(f))
        object.__setattr__(self, "input_shape", shape)
        object.__setattr__(self, "p_max_w", cap)
        for name, table in (
            ("time_per_sample_s", time_s),
            ("peak_power_w", peak_w),
            ("avg_power_w", avg_w),
        ):
            table = np.array(table, dtype=np.float64)  # a private, read-only copy
            table.flags.writeable = False
            object.__setattr__(self, name, table)

    @property
    def workload_key(self) -> str:
        """Same key as ``Workload.key``: model and input shape."""
        return Workload(self.model_name, self.input_shape, 0.0).key

    @property
    def is_full_grid(self) -> bool:
        """Whether every cell was profiled (such a LUT serves any cap)."""
        return bool(np.all(~np.isnan(self.time_per_sample_s)))

    @property
    def cells_profiled(self) -> int:
        """How many (b, f) cells were measured."""
        return int(np.count_nonzero(~np.isnan(self.time_per_sample_s)))

    def to_json(self) -> str:
        """Strict JSON (NaN written as null), kebab-case keys."""

        def table(arr: FloatArray) -> list[list[float | None]]:
            return [[None if math.isnan(x) else float(x) for x in row] for row in arr]

        record = {
            "format": LUT_FORMAT,
            "version": LUT_VERSION,
            "device-kind": self.device_kind,
            "backend": self.backend,
            "model-name": self.model_name,
            "input-shape": list(self.input_shape),
            "workload-key": self.workload_key,
            "batch-sizes": list(self.batch_sizes),
            "freqs-mhz": list(self.freqs_mhz),
            "p-max-w": self.p_max_w,
            "time-per-sample-s": table(self.time_per_sample_s),
            "peak-power-w": table(self.peak_power_w),
            "avg-power-w": table(self.avg_power_w),
            "profile-time-s": self.profile_time_s,
            "profile-energy-j": self.profile_energy_j,
            "created-utc": self.created_utc,
            "warmup-steps": self.warmup_steps,
            "steps": self.steps,
            "grid": self.grid,
        }
        return json.dumps(record, indent=1, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> LUT:
        """Parse and validate ``to_json`` output.

        Raises
        ------
        LUTFormatError
            On invalid JSON, a missing, unknown or mistyped key, a wrong format/version,
            mismatching shapes, or a workload key that does not match model and shape.
        """
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as err:
            raise LUTFormatError(f"not valid JSON: {err}") from None
        if not isinstance(rec, dict):
            raise LUTFormatError("a LUT file holds one JSON object")
        expected = {
            "format": str,
            "version": int,
            "device-kind": str,
            "backend": str,
            "model-name": str,
            "input-shape": list,
            "workload-key": str,
            "batch-sizes": list,
            "freqs-mhz": list,
            "p-max-w": (int, float, type(None)),
            "time-per-sample-s": list,
            "peak-power-w": list,
            "avg-power-w": list,
            "profile-time-s": (int, float),
            "profile-energy-j": (int, float),
            "created-utc": str,
            "warmup-steps": int,
            "steps": int,
        }
        optional = {"grid": str}  # absent in files written before it existed
        missing = sorted(set(expected) - set(rec))
        unknown = sorted(set(rec) - set(expected) - set(optional))
        expected.update({k: v for k, v in optional.items() if k in rec})
        if missing or unknown:
            raise LUTFormatError(f"keys: missing {missing}, unknown {unknown}")
        for key, kind in expected.items():
            if not isinstance(rec[key], kind) or isinstance(rec[key], bool):  # type: ignore[arg-type]
                raise LUTFormatError(f"{key}: wrong type {type(rec[key]).__name__}")
        if rec["format"] != LUT_FORMAT or rec["version"] != LUT_VERSION:
            raise LUTFormatError(
                f"format: expected {LUT_FORMAT} v{LUT_VERSION}, got {rec['format']} "
                f"v{rec['version']}"
            )
        for key in ("input-shape", "batch-sizes"):
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in rec[key]):
                raise LUTFormatError(f"{key}: must be a list of integers")
        if not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in rec["freqs-mhz"]
        ):
            raise LUTFormatError("freqs-mhz: must be a list of numbers")
        lut = cls(
            device_kind=rec["device-kind"],
            backend=rec["backend"],
            model_name=rec["model-name"],
            input_shape=tuple(rec["input-shape"]),
            batch_sizes=tuple(rec["batch-sizes"]),
            freqs_mhz=tuple(rec["freqs-mhz"]),
            time_per_sample_s=_table_from_json(rec["time-per-sample-s"], "time-per-sample-s"),
            peak_power_w=_table_from_json(rec["peak-power-w"], "peak-power-w"),
            avg_power_w=_table_from_json(rec["avg-power-w"], "avg-power-w"),
            p_max_w=rec["p-max-w"],
            profile_time_s=rec["profile-time-s"],
            profile_energy_j=rec["profile-energy-j"],
            created_utc=rec["created-utc"],
            warmup_steps=rec["warmup-steps"],
            steps=rec["steps"],
            grid=rec.get("grid", ""),
        )
        if lut.workload_key != rec["workload-key"]:
            raise LUTFormatError(
                f"workload-key: {rec['workload-key']!r} does not match model and input shape "
                f"({lut.workload_key!r})"
            )
        return lut

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically (temporary file in the same folder, then ``os.replace``)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(self.to_json())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LUT:
        """Read a file written by ``save``; LUTFormatError if it is malformed."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise LUTFormatError(f"not UTF-8 text: {err}") from None
        return cls.from_json(text)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _table_from_json(rows: list[Any], key: str) -> FloatArray:
    if not all(isinstance(row, list) for row in rows):
        raise LUTFormatError(f"{key}: must be a list of rows")
    lengths = {len(row) for row in rows}
    if len(lengths) > 1:
        raise LUTFormatError(f"{key}: rows of different lengths {sorted(lengths)}")
    for row in rows:
        for x in row:
            if x is not None and not _is_number(x):
                raise LUTFormatError(f"{key}: cells must be numbers or null; got {x!r}")
    n_f = lengths.pop() if lengths else 0
    out = np.array(
        [[math.nan if x is None else float(x) for x in row] for row in rows], dtype=np.float64
    )
    return out.reshape(len(rows), n_f)


# --------------------------------------------------------------------------- profiling


class _Progress:
    """A rich progress bar on a terminal, one plain line per cell otherwise, or nothing."""

    def __init__(self, enabled: bool, title: str, total: int | None, stream: IO[str]):
        self._stream = stream
        self._title = title
        self._total = total
        self._done = 0
        self._bar: Any = None
        self._task: Any = None
        self._enabled = enabled
        if enabled and stream.isatty():
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(console=Console(file=stream), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(title, total=total)

    def cell(self, b: int, freq_mhz: float, m: Measurement) -> None:
        self._done += 1
        if not self._enabled:
            return
        tps_ms = 1e3 * m.time_s / max(m.samples, 1)
        what = f"b={b} f={freq_mhz:g} MHz: {tps_ms:.3f} ms/sample, peak {m.peak_power_w:.2f} W"
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=f"{self._title} {what}")
        else:
            of = f"/{self._total}" if self._total is not None else ""
            print(f"{self._title} [{self._done}{of}] {what}", file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _run_steps(
    device: Device, workload: Workload, batch_size: int, step: Callable[[], object], n: int
) -> Measurement:
    with device.measure(workload) as meter:
        for _ in range(n):
            meter.step(batch_size, step)
    return meter.measurement


def time_per_sample_s(m: Measurement, batch_size: int, steps: int) -> float:
    """A measurement's time per sample (the samples it counted, else ``batch_size × steps``)."""
    return m.time_s / (m.samples if m.samples > 0 else batch_size * steps)


def _new_tables(shape: tuple[int, int]) -> dict[str, FloatArray]:
    """Empty (all NaN) time, peak and average power tables of a (|B|, |F|) grid."""
    return {name: np.full(shape, np.nan) for name in ("time", "peak", "avg")}


def _record(
    tables: dict[str, FloatArray], i: int, j: int, m: Measurement, batch_size: int, steps: int
) -> None:
    """Write one measured cell into ``_new_tables``' tables."""
    tables["time"][i, j] = time_per_sample_s(m, batch_size, steps)
    tables["peak"][i, j] = m.peak_power_w
    tables["avg"][i, j] = m.avg_power_w


def _lut_of(
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    tables: dict[str, FloatArray],
    **fields: Any,
) -> LUT:
    """The LUT of ``tables`` measured on ``device`` (its frequency table as columns)."""
    info = device.info
    return LUT(
        device_kind=info.kind,
        backend=info.backend,
        model_name=workload.model_name,
        input_shape=tuple(workload.input_shape),
        batch_sizes=tuple(batch_sizes),
        freqs_mhz=tuple(float(f) for f in device.gpu_freqs_mhz),
        time_per_sample_s=tables["time"],
        peak_power_w=tables["peak"],
        avg_power_w=tables["avg"],
        **fields,
    )


def _efficient_row(feasible: Callable[[int], bool], start: int, n_f: int) -> int | None:
    """Walk one batch size's frequencies for efficient mode; its highest feasible index.

    Up from ``start`` until the first infeasible index (``feasible`` measures each index it
    is asked about); if ``start`` itself is infeasible, down until a feasible one.
    """
    highest = None
    j = start
    while j < n_f and feasible(j):
        highest = j
        j += 1
    if highest is None:
        for k in range(start - 1, -1, -1):
            if feasible(k):
                return k
    return highest


def profile(
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    step_factory: StepFactory,
    *,
    p_max_w: float | str | None = None,
    warmup_steps: int = 1,
    steps: int = 3,
    progress: bool = True,
    progress_stream: IO[str] | None = None,
    uncapped: str = "full",
) -> LUT:
    """Measure LUT_time and LUT_power of ``workload`` on ``device`` (paper §4.1).

    For each profiled (b, f): lock the GPU at f, run ``warmup_steps`` steps (accounted for
    in the profiling cost, not in the tables), then ``steps`` steps through
    ``device.measure``; record time per sample, peak and average power. The device is
    restored at the end whatever happens.

    Without a cap every cell is profiled. With ``p_max_w`` (efficient mode) the largest b
    goes from the lowest f upward until the first f whose peak power is not below the cap
    (measured, recorded, then stop); each next smaller b starts at the previous b's highest
    feasible f (the lowest f if it had none) and goes up the same way. Should that starting
    cell already break the cap (power not monotone in b), the b walks down until a feasible
    f, so its highest feasible f is still found. Cells never visited stay NaN. On tables
    whose power rises with b and f this finds, per b, the same ``feasible_freq_index`` as
    the full grid.

    Parameters
    ----------
    device : Device
        The GPU to profile; its frequency table gives the columns.
    workload : Workload
        Model and input shape (the LUT's key).
    batch_sizes : sequence of int
        B, strictly ascending.
    step_factory : callable
        ``step_factory(b)`` returns a zero-argument function that runs ONE real training
        minibatch of size b (e.g. ``fl_client.task.make_train_step``); called once per b.
    p_max_w : float, str or None
        The cap for efficient mode; None / "none" / infinity profiles the full grid.
    warmup_steps : int
        Steps per cell run first and discarded (≥ 0).
    steps : int
        Measured steps per cell (≥ 1).
    progress : bool
        Show progress (rich bar on a terminal, plain lines otherwise); False: silent.
    progress_stream : text stream, optional
        Where progress goes; default ``sys.stderr``.
    uncapped : {"full", "highest"}
        Without a cap: profile every cell (``full``), or each b at the highest frequency
        only (``highest``), which is what Eq. 4 selects per b when no cell is infeasible.

    Returns
    -------
    LUT
        With ``profile_time_s`` the device time (``device.now_s()``) profiling took.
    """
    b_list = validate_batch_sizes(batch_sizes)
    cap = validate_p_max_w(p_max_w)
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup-steps: must be an integer ≥ 0; got {warmup_steps!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: must be an integer ≥ 1; got {steps!r}")
    if uncapped not in ("full", "highest"):
        raise ValueError(f"uncapped: unknown value {uncapped!r}; allowed: full, highest")
    grid = "efficient" if cap is not None else uncapped
    freqs = tuple(float(f) for f in device.gpu_freqs_mhz)
    info = device.info
    shape = (len(b_list), len(freqs))
    tables = _new_tables(shape)
    energy_j = 0.0

    total = {"full": shape[0] * shape[1], "highest": shape[0]}.get(grid)
    if grid == "efficient":
        mode = f"efficient, P_max {cap:g} W"
    else:
        mode = {"full": "full grid", "highest": "no cap: highest frequency per b"}[grid]
    bar = _Progress(
        progress,
        f"profile {info.kind} {workload.key} ({mode})",
        total,
        progress_stream if progress_stream is not None else sys.stderr,
    )
    start_s = device.now_s()
    try:
        start_j = 0  # efficient mode: where the next (smaller) b starts
        for i in reversed(range(len(b_list))):
            b = b_list[i]
            step = step_factory(b)

            def cell(j: int, i: int = i, b: int = b, step: Callable[[], object] = step) -> bool:
                """Profile (b, freqs[j]) into the tables; whether it is below the cap."""
                nonlocal energy_j
                device.set_gpu_freq_mhz(freqs[j])
                if warmup_steps:
                    energy_j += _run_steps(device, workload, b, step, warmup_steps).energy_j
                m = _run_steps(device, workload, b, step, steps)
                energy_j += m.energy_j
                _record(tables, i, j, m, b, steps)
                bar.cell(b, freqs[j], m)
                return cap is None or m.peak_power_w < cap

            if grid == "full":
                for j in range(len(freqs)):
                    cell(j)
            elif grid == "highest":
                cell(len(freqs) - 1)
            else:
                highest = _efficient_row(cell, start_j, len(freqs))
                start_j = 0 if highest is None else highest
            del cell, step  # free this b's model before the next one is built
    finally:
        bar.close()
        device.restore()
    end_s = device.now_s()
    return _lut_of(
        device,
        workload,
        b_list,
        tables,
        p_max_w=cap,
        profile_time_s=max(end_s - start_s, 0.0),
        profile_energy_j=energy_j,
        warmup_steps=warmup_steps,
        steps=steps,
        grid=grid,
    )


# --------------------------------------------------------------------------- cache


def _utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


def lut_cache_path(
    cache_dir: str | os.PathLike[str],
    device_kind: str,
    backend: str,
    workload: Workload,
    batch_sizes: Sequence[int],
    p_max_w: float | None,
    grid: str = "",
) -> Path:
    """Where the LUT of these settings is cached.

    The name is readable (kind, backend, workload key, B, ``full`` or the cap) and ends in
    a short hash of the exact key, so differently spelled names never share a file.
    ``p_max_w`` None names the full grid (or, with ``grid`` ``highest`` or ``on-demand``,
    that grid); a number names an efficient-mode profile.
    """
    named_grid = p_max_w is None and grid in ("highest", "on-demand")
    cap = grid if named_grid else "full" if p_max_w is None else f"pmax{float(p_max_w)!r}w"
    parts = [device_kind, backend, workload.key, "b" + "-".join(map(str, batch_sizes)), cap]
    exact = json.dumps(
        [
            device_kind,
            backend,
            workload.model_name,
            list(workload.input_shape),
            list(batch_sizes),
            p_max_w,
            *([grid] if named_grid else []),
        ]
    )
    digest = hashlib.sha256(exact.encode()).hexdigest()[:10]
    readable = "_".join(re.sub(r"[^A-Za-z0-9.+-]+", "-", p) for p in parts)
    return Path(cache_dir) / f"lut_{readable}_{digest}.json"


def _mismatch(
    lut: LUT,
    device: Device,
    workload: Workload,
    batch_sizes: list[int],
    p_max_w: float | None,
    grid: str,
) -> str | None:
    """Why a cached LUT does not fit this request (None if it does)."""
    info = device.info
    expected: dict[str, tuple[object, object]] = {
        "device-kind": (lut.device_kind, info.kind),
        "backend": (lut.backend, info.backend),
        "model-name": (lut.model_name, workload.model_name),
        "input-shape": (lut.input_shape, tuple(workload.input_shape)),
        "batch-sizes": (lut.batch_sizes, tuple(batch_sizes)),
        "freqs-mhz": (lut.freqs_mhz, tuple(float(f) for f in device.gpu_freqs_mhz)),
        "p-max-w": (lut.p_max_w, p_max_w),
        "grid": (lut.grid, grid),
    }
    for key, (got, want) in expected.items():
        if got != want:
            return f"{key} is {got!r}, expected {want!r}"
    return None


def _load_cached(
    path: Path,
    device: Device,
    workload: Workload,
    batch_sizes: list[int],
    p_max_w: float | None,
    grid: str,
) -> LUT | None:
    """The cached LUT at ``path`` if it is valid and fits; a bad file is set aside."""
    if not path.is_file():
        return None
    try:
        lut = LUT.load(path)
        reason = _mismatch(lut, device, workload, batch_sizes, p_max_w, grid)
    except (LUTFormatError, OSError) as err:
        reason = str(err)
    if reason is None:
        return lut
    aside = path.with_name(f"{path.name}.corrupt-{_utc_stamp()}")
    try:
        path.rename(aside)
        kept = f"kept as {aside.name}"
    except OSError as err:
        kept = f"could not be set aside ({err})"
    log.warning(
        "LUT cache %s is corrupt or does not match (%s): %s; re-profiling", path, reason, kept
    )
    return None


def load_or_profile(
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    step_factory: StepFactory,
    cache_dir: str | os.PathLike[str],
    *,
    p_max_w: float | str | None = None,
    warmup_steps: int = 1,
    steps: int = 3,
    progress: bool = True,
    progress_stream: IO[str] | None = None,
    uncapped: str = "full",
) -> tuple[LUT, bool]:
    """The cached LUT for these settings, or a new profile (then cached).

    A cached full-grid LUT serves any cap; an efficient-mode LUT serves only its own cap,
    a highest-frequency LUT (``uncapped="highest"``) only runs without a cap.
    A cache file that is corrupt or does not match (device, backend, model, input shape,
    B, frequency table, cap) is renamed ``<name>.corrupt-<UTC timestamp>`` with a logged
    warning, and the tables are profiled again. Files are written atomically; a cache that
    cannot be written only costs a warning.

    Parameters
    ----------
    device, workload, batch_sizes, step_factory, p_max_w, warmup_steps, steps, progress,
    progress_stream, uncapped
        As in ``profile``; ``p_max_w`` None profiles (and caches) the full grid, or with
        ``uncapped="highest"`` the highest frequency of each b.
    cache_dir : path
        Folder of the cache files (created if needed).

    Returns
    -------
    (LUT, bool)
        The tables, and whether they came from the cache (no profiling cost this time).
    """
    b_list = validate_batch_sizes(batch_sizes)
    cap = validate_p_max_w(p_max_w)
    info = device.info
    if uncapped not in ("full", "highest"):
        raise ValueError(f"uncapped: unknown value {uncapped!r}; allowed: full, highest")
    wanted: list[tuple[float | None, str]] = [(None, "full")]
    if cap is not None:
        wanted.append((cap, "efficient"))
    elif uncapped == "highest":
        wanted.append((None, "highest"))
    for want_cap, want_grid in wanted:
        path = lut_cache_path(
            cache_dir, info.kind, info.backend, workload, b_list, want_cap, want_grid
        )
        cached = _load_cached(path, device, workload, b_list, want_cap, want_grid)
        if cached is not None:
            return cached, True
    lut = profile(
        device,
        workload,
        b_list,
        step_factory,
        p_max_w=cap,
        warmup_steps=warmup_steps,
        steps=steps,
        progress=progress,
        progress_stream=progress_stream,
        uncapped=uncapped,
    )
    try:
        lut.save(path)  # the last path tried: the full grid's, or this cap's
    except OSError as err:
        log.warning("could not write the LUT cache %s (%s); profiling again next time", path, err)
    return lut, False


# --------------------------------------------------------------------------- merging


def scale_cells(lut: LUT, *, time_factor: float, peak_factor: float, avg_factor: float) -> LUT:
    """``lut`` with every measured cell scaled (an estimate of a uniform drift).

    Used after a drift check re-profiled one row: the other rows are scaled by the change
    measured on that row until they are measured again.
    """
    for key, factor in (
        ("time-factor", time_factor),
        ("peak-factor", peak_factor),
        ("avg-factor", avg_factor),
    ):
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"{key}: must be a finite number > 0, got {factor!r}")
    return dataclasses.replace(
        lut,
        time_per_sample_s=lut.time_per_sample_s * time_factor,
        peak_power_w=lut.peak_power_w * peak_factor,
        avg_power_w=lut.avg_power_w * avg_factor,
    )


def merge_cells(base: LUT, extra: LUT, *, overwrite: bool) -> LUT:
    """``base`` with the measured cells of ``extra`` (same device, model, frequencies).

    ``extra`` may cover only some of ``base``'s batch sizes (e.g. one re-profiled row).
    ``overwrite=False`` only fills cells ``base`` left NaN (its own measurements win);
    ``overwrite=True`` replaces every cell ``extra`` measured (fresh measurements win, as
    after a drift check). The result keeps ``base``'s cap, grid and profiling cost.

    Raises
    ------
    LUTFormatError
        When the two tables are not of the same device, backend, workload and frequency
        table, or ``extra`` has a batch size ``base`` lacks.
    """
    for name in ("device_kind", "backend", "model_name", "input_shape", "freqs_mhz"):
        if getattr(base, name) != getattr(extra, name):
            raise LUTFormatError(
                f"{name.replace('_', '-')}: cannot merge LUTs of {getattr(base, name)!r} and "
                f"{getattr(extra, name)!r}"
            )
    unknown = sorted(set(extra.batch_sizes) - set(base.batch_sizes))
    if unknown:
        raise LUTFormatError(f"batch-sizes: {unknown} are not rows of the base LUT")
    tables = {
        name: np.array(getattr(base, name), dtype=np.float64)
        for name in ("time_per_sample_s", "peak_power_w", "avg_power_w")
    }
    for i_extra, b in enumerate(extra.batch_sizes):
        i = base.batch_sizes.index(b)
        measured = ~np.isnan(extra.time_per_sample_s[i_extra])
        take = measured if overwrite else measured & np.isnan(tables["time_per_sample_s"][i])
        for name, table in tables.items():
            table[i, take] = getattr(extra, name)[i_extra, take]
    return dataclasses.replace(
        base,
        time_per_sample_s=tables["time_per_sample_s"],
        peak_power_w=tables["peak_power_w"],
        avg_power_w=tables["avg_power_w"],
    )


def measure_cell(
    device: Device,
    workload: Workload,
    batch_size: int,
    step: Callable[[], object],
    freq_mhz: float,
    *,
    warmup_steps: int = 1,
    steps: int = 3,
) -> tuple[Measurement, float, float]:
    """Measure one (b, f) cell as ``profile`` does (warm-up, then ``steps`` steps).

    Returns the measured steps' ``Measurement`` plus the device time and energy of the
    whole check (warm-up included), which is profiling cost. The frequency is restored.
    """
    start_s = device.now_s()
    energy_j = 0.0
    try:
        device.set_gpu_freq_mhz(freq_mhz)
        if warmup_steps:
            energy_j += _run_steps(device, workload, batch_size, step, warmup_steps).energy_j
        m = _run_steps(device, workload, batch_size, step, steps)
        energy_j += m.energy_j
    finally:
        device.restore()
    return m, max(device.now_s() - start_s, 0.0), energy_j


# --------------------------------------------------------------------------- cells on demand


def on_demand_path(
    cache_dir: str | os.PathLike[str],
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
) -> Path:
    """Where a device's cells measured on demand (``grid="on-demand"``) are cached."""
    info = device.info
    return lut_cache_path(
        cache_dir, info.kind, info.backend, workload, list(batch_sizes), None, "on-demand"
    )


def load_on_demand(
    cache_dir: str | os.PathLike[str],
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
) -> LUT | None:
    """The cached on-demand cells of this device and workload, or None (a bad file is set
    aside as ``load_or_profile`` does)."""
    b_list = validate_batch_sizes(batch_sizes)
    path = on_demand_path(cache_dir, device, workload, b_list)
    return _load_cached(path, device, workload, b_list, None, "on-demand")


def add_measured_cell(
    cells: LUT | None,
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    batch_size: int,
    step: Callable[[], object],
    freq_mhz: float,
    *,
    warmup_steps: int = 1,
    steps: int = 3,
) -> tuple[LUT, float, float]:
    """``cells`` (an on-demand LUT, or None for a new one) with (b, f) measured now.

    Measured as ``profile`` measures a cell (``measure_cell``); the cell replaces any value
    ``cells`` had, and its device time and energy are added to ``cells``' profiling cost.
    Returns the new cells and the device time and energy of this measurement.
    """
    b_list = validate_batch_sizes(batch_sizes)
    freqs = tuple(float(f) for f in device.gpu_freqs_mhz)
    if batch_size not in b_list or freq_mhz not in freqs:
        raise ValueError(f"batch-size / gpu-freq-mhz: ({batch_size}, {freq_mhz:g}) is not a cell")
    m, time_s, energy_j = measure_cell(
        device, workload, batch_size, step, freq_mhz, warmup_steps=warmup_steps, steps=steps
    )
    tables = _new_tables((len(b_list), len(freqs)))
    _record(tables, b_list.index(batch_size), freqs.index(freq_mhz), m, batch_size, steps)
    one = _lut_of(
        device,
        workload,
        b_list,
        tables,
        profile_time_s=time_s,
        profile_energy_j=energy_j,
        warmup_steps=warmup_steps,
        steps=steps,
        grid="on-demand",
    )
    if cells is not None:
        one = dataclasses.replace(
            merge_cells(cells, one, overwrite=True),
            profile_time_s=cells.profile_time_s + time_s,
            profile_energy_j=cells.profile_energy_j + energy_j,
        )
    return one, time_s, energy_j
