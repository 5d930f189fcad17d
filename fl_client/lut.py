"""The LUT file: LUT_time / LUT_power / average power / σ of the per-step peaks per (batch
size, GPU knob value), its JSON format, the on-disk cache (one file per device kind, backend,
workload, B, cap and cap-margin). Its JSON format's checks live in ``lut_format``, merging
and scaling of measured cells in ``lut_cells``, measuring in ``profiler``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from fl_client.devices.base import (
    GPU_FREQ_MHZ,
    Device,
    Knob,
    Workload,
    device_knob,
    knob_for,
)
from fl_client.files import set_aside, write_atomic
from fl_client.lut_format import (
    CELL_TABLES,
    CHECKSUM_KEY,
    GRIDS,
    LUT_FORMAT,
    LUT_VERSION,
    FloatArray,
    LUTFormatError,
    cell_table,
    checked_record,
    limit_of_record,
    sigma_table,
    table_from_json,
)
from fl_client.power import PowerLimit
from fl_client.selection import Tables
from fl_client.selector_inputs import validate_batch_sizes, validate_knob_values, validate_tables

log = logging.getLogger(__name__)

#: No cap: the limit of every LUT but an efficient-mode one.
NO_CAP = PowerLimit()


def _utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, eq=False)
class LUT:
    """The profiled lookup tables of one (device, backend, model, input shape).

    Rows follow ``batch_sizes``, columns ``knob_values``; NaN marks a cell that was not
    profiled (efficient mode), in the time and power tables at once (σ may be NaN in a
    profiled cell too: not recorded). Arrays are read-only copies.

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
    knob_values : tuple of float
        The device's knob values, strictly ascending: its frequency table in MHz, or the
        values of ``knob``.
    time_per_sample_s : ndarray, shape (|B|, |F|)
        Training time per sample in seconds (LUT_time).
    peak_power_w : ndarray, shape (|B|, |F|)
        Highest power sample in W (LUT_power, what Eq. 4 compares with P_max).
    avg_power_w : ndarray, shape (|B|, |F|)
        Energy / time of the measured steps in W.
    limit : PowerLimit
        The cap with its margin efficient mode profiled for (``p-max-w`` and ``cap-margin``
        in the file); no cap (``NO_CAP``) for every other grid.
    profile_time_s : float
        Device time the profiling took (warm-up and measured steps, frequency changes).
    profile_energy_j : float
        Energy of the warm-up and measured steps.
    created_utc : str
        ISO-8601 UTC time the tables were made.
    warmup_steps, steps : int
        Steps discarded per cell, and the least number measured per cell (a cell sized by
        its sensor measures more: ``power_samples``, ``window_s``).
    grid : str
        ``full`` (every cell; serves any cap), ``efficient`` (paper §4.1 under
        ``limit``) or ``highest`` (no cap: each b at the highest frequency only, the
        cell Eq. 4 picks per b when nothing is infeasible) or ``on-demand`` (no cap: single
        cells that earlier versions' deadline pacing measured below f*; nothing writes
        them now; the value is kept so such cache files still load; never selected from).
        Default: ``full`` without a cap, ``efficient`` with one.
    peak_sigma_w : ndarray, shape (|B|, |F|)
        Standard deviation of the per-step peak powers of each measured cell in W (the
        selector's feasibility margin, ``peak-sigma-k``·σ); NaN where not profiled or not
        recorded (one measured step, or a file written before version 3), which counts as
        0. Constructed without it (the default, an empty array) or with None: nothing
        recorded, all NaN.
    knob : Knob
        What the columns are: ``GPU_FREQ_MHZ`` (default) or e.g. ``GPU_POWER_LIMIT_W``.
    power_samples, window_s, settled, needed_window_s : ndarray, shape (|B|, |F|)
        How each cell was measured (``CELL_TABLES``): the power samples its measured steps
        held, their device time in s, 1 if it settled (0: stopped at the profiler's hard
        cap), and on an emulated device the window in s the real board's sensor would have
        needed. NaN where not profiled or not recorded; like σ, each is all NaN when
        constructed without it.
    """

    device_kind: str
    backend: str
    model_name: str
    input_shape: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    knob_values: tuple[float, ...]
    time_per_sample_s: FloatArray
    peak_power_w: FloatArray
    avg_power_w: FloatArray
    limit: PowerLimit = NO_CAP
    profile_time_s: float = 0.0
    profile_energy_j: float = 0.0
    created_utc: str = field(default_factory=_utc_now)
    warmup_steps: int = 1
    steps: int = 3
    grid: str = ""
    peak_sigma_w: FloatArray = field(default_factory=lambda: np.empty((0, 0)))
    knob: Knob = GPU_FREQ_MHZ
    power_samples: FloatArray = field(default_factory=lambda: np.empty((0, 0)))
    window_s: FloatArray = field(default_factory=lambda: np.empty((0, 0)))
    settled: FloatArray = field(default_factory=lambda: np.empty((0, 0)))
    needed_window_s: FloatArray = field(default_factory=lambda: np.empty((0, 0)))
    time_rse: FloatArray = field(default_factory=lambda: np.empty((0, 0)))
    clock_mhz: FloatArray = field(default_factory=lambda: np.empty((0, 0)))
    clock_moved: FloatArray = field(default_factory=lambda: np.empty((0, 0)))
    energy_from_counter: FloatArray = field(default_factory=lambda: np.empty((0, 0)))
    clocks_locked: bool | None = None

    def __post_init__(self) -> None:
        try:
            b = validate_batch_sizes(list(self.batch_sizes))
            f = validate_knob_values(list(self.knob_values))
            time_s, peak_w = validate_tables(
                self.time_per_sample_s, self.peak_power_w, len(b), len(f)
            )
            # Average power has the same cells and the same rules as peak power.
            avg_w = validate_tables(time_s, self.avg_power_w, len(b), len(f))[1]
        except ValueError as err:
            raise LUTFormatError(str(err)) from None
        sigma_w = sigma_table(self.peak_sigma_w, np.isnan(time_s))
        cells = {
            name: cell_table(getattr(self, name), np.isnan(time_s), key)
            for name, key in CELL_TABLES.items()
        }
        if not isinstance(self.limit, PowerLimit):
            raise LUTFormatError(f"p-max-w: the cap must be a PowerLimit, got {self.limit!r}")
        cap = self.limit.cap_w
        if not isinstance(self.knob, Knob):
            raise LUTFormatError(f"knob: must be a Knob, got {self.knob!r}")
        grid = self.grid or ("full" if cap is None else "efficient")
        if grid not in GRIDS:
            raise LUTFormatError(f"grid: unknown value {grid!r}; allowed: {', '.join(GRIDS)}")
        if grid == "full" and (cap is not None or np.isnan(time_s).any()):
            raise LUTFormatError("a full-grid LUT needs p-max-w none and every cell profiled")
        if grid == "efficient" and cap is None:
            raise LUTFormatError("an efficient-mode LUT needs the cap it was made for (p-max-w)")
        if grid in ("highest", "on-demand", "shared") and cap is not None:
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
        object.__setattr__(self, "knob_values", tuple(f))
        object.__setattr__(self, "input_shape", shape)
        for name, table in (
            ("time_per_sample_s", time_s),
            ("peak_power_w", peak_w),
            ("avg_power_w", avg_w),
            ("peak_sigma_w", sigma_w),
            *cells.items(),
        ):
            table = np.array(table, dtype=np.float64)  # a private, read-only copy
            table.flags.writeable = False
            object.__setattr__(self, name, table)

    @property
    def key(self) -> LUTKey:
        """The cache key this LUT answers."""
        return LUTKey(
            self.device_kind,
            self.backend,
            Workload(self.model_name, self.input_shape, 0.0),
            self.batch_sizes,
            self.knob_values,
            self.limit,
            self.grid,
        )

    @property
    def tables(self) -> Tables:
        """What a selection reads: time, peak and average power, σ and the knob."""
        return Tables(
            self.time_per_sample_s,
            self.peak_power_w,
            self.avg_power_w,
            self.peak_sigma_w,
            self.knob,
        )

    @property
    def workload_key(self) -> str:
        """Same key as ``Workload.key``: model and input shape."""
        return Workload(self.model_name, self.input_shape, 0.0).key

    @property
    def cells_profiled(self) -> int:
        """How many (b, f) cells were measured."""
        return int(np.count_nonzero(~np.isnan(self.time_per_sample_s)))

    @property
    def board_profile_time_s(self) -> float | None:
        """The profiling time the real board's sensor windows imply (emulated devices):
        ``profile_time_s`` with each cell's measured window replaced by the window the
        board would have needed; None unless every measured cell recorded both."""
        measured = ~np.isnan(self.time_per_sample_s)
        window, needed = self.window_s[measured], self.needed_window_s[measured]
        if not measured.any() or np.isnan(window).any() or np.isnan(needed).any():
            return None
        return float(self.profile_time_s - window.sum() + needed.sum())

    def to_json(self) -> str:
        """Strict JSON (NaN written as null), kebab-case keys."""

        def table(arr: FloatArray) -> list[list[float | None]]:
            return [[None if math.isnan(x) else float(x) for x in row] for row in arr]

        sigma_w = self.peak_sigma_w
        has_sigma = bool(np.isfinite(sigma_w).any())
        cells = {
            key: getattr(self, name)
            for name, key in CELL_TABLES.items()
            if np.isfinite(getattr(self, name)).any()
        }
        new_keys = (
            has_sigma or self.knob != GPU_FREQ_MHZ or bool(cells) or self.clocks_locked is not None
        )
        record = {
            "format": LUT_FORMAT,
            "version": LUT_VERSION if new_keys else 2,
            "device-kind": self.device_kind,
            "backend": self.backend,
            "model-name": self.model_name,
            "input-shape": list(self.input_shape),
            "workload-key": self.workload_key,
            "batch-sizes": list(self.batch_sizes),
            self.knob.values_key: list(self.knob_values),  # freqs-mhz, or power-limits-w
            "p-max-w": self.limit.cap_w,
            "cap-margin": self.limit.cap_margin,
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
        if has_sigma:
            record["peak-sigma-w"] = table(sigma_w)
        if self.knob != GPU_FREQ_MHZ:
            record["knob"] = self.knob.key.replace("_", "-")
        for key, values in cells.items():
            record[key] = table(values)
        if self.clocks_locked is not None:
            record["clocks-locked"] = self.clocks_locked
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
        rec = checked_record(text)
        sigma_w = np.empty((0, 0))  # not recorded
        if "peak-sigma-w" in rec:
            sigma_w = table_from_json(rec["peak-sigma-w"], "peak-sigma-w")
        try:
            knob = knob_for(rec["knob"]) if "knob" in rec else GPU_FREQ_MHZ
        except ValueError as err:
            raise LUTFormatError(str(err)) from None
        time_s = table_from_json(rec["time-per-sample-s"], "time-per-sample-s")
        cells = {}
        for name, key in CELL_TABLES.items():
            if key in rec:
                cells[name] = table_from_json(rec[key], key)
                if cells[name].shape != time_s.shape:
                    raise LUTFormatError(
                        f"{key}: shape {cells[name].shape} does not match the other tables "
                        f"{time_s.shape}"
                    )
        lut = cls(
            device_kind=rec["device-kind"],
            backend=rec["backend"],
            model_name=rec["model-name"],
            input_shape=tuple(rec["input-shape"]),
            batch_sizes=tuple(rec["batch-sizes"]),
            knob_values=tuple(rec["freqs-mhz"]),
            time_per_sample_s=time_s,
            peak_power_w=table_from_json(rec["peak-power-w"], "peak-power-w"),
            avg_power_w=table_from_json(rec["avg-power-w"], "avg-power-w"),
            limit=limit_of_record(rec["p-max-w"], rec.get("cap-margin", 0.0)),
            profile_time_s=rec["profile-time-s"],
            profile_energy_j=rec["profile-energy-j"],
            created_utc=rec["created-utc"],
            warmup_steps=rec["warmup-steps"],
            steps=rec["steps"],
            grid=rec.get("grid", ""),
            peak_sigma_w=sigma_w,
            knob=knob,
            clocks_locked=rec.get("clocks-locked"),
            **cells,
        )
        if lut.workload_key != rec["workload-key"]:
            raise LUTFormatError(
                f"workload-key: {rec['workload-key']!r} does not match model and input shape "
                f"({lut.workload_key!r})"
            )
        return lut

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically (temporary file in the same folder, then ``os.replace``), with
        ``content-sha256``: the SHA-256 of the LUT's canonical JSON (``lut_checksum``), which
        ``load`` checks."""
        rec = json.loads(self.to_json())
        rec[CHECKSUM_KEY] = lut_checksum(self)
        return write_atomic(path, json.dumps(rec, indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, require_checksum: bool = False) -> LUT:
        """Read a file written by ``save``; LUTFormatError if it is malformed, if its
        content does not match its ``content-sha256``, or (``require_checksum``: a cache)
        if it has none (written before checksums: never trusted)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise LUTFormatError(f"not UTF-8 text: {err}") from None
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as err:
            raise LUTFormatError(f"not valid JSON: {err}") from None
        stored = rec.pop(CHECKSUM_KEY, None) if isinstance(rec, dict) else None
        if stored is None:
            if require_checksum:
                raise LUTFormatError(f"{CHECKSUM_KEY}: missing (written before checksums)")
            return cls.from_json(text)
        lut = cls.from_json(json.dumps(rec))
        if stored != lut_checksum(lut):
            raise LUTFormatError(f"{CHECKSUM_KEY}: the content does not match its checksum")
        return lut


# --------------------------------------------------------------------------- cache


@dataclass(frozen=True)
class LUTKey:
    """What a LUT is for: device kind, backend, workload, B, knob values, cap and grid.

    ``limit`` is the cap with its margin an efficient-mode LUT was profiled for (no cap:
    ``NO_CAP``); the profiler's walk compares robust peaks with ``limit.limit_w``. The bare
    cap and its margin name the file (as the LUT stores them), so a LUT profiled under 5 W
    with a 5% margin serves ``select --p-max-w 5 --cap-margin 0.05``.
    """

    device_kind: str
    backend: str
    workload: Workload
    batch_sizes: tuple[int, ...]
    knob_values: tuple[float, ...]
    limit: PowerLimit = NO_CAP
    grid: str = "full"
    knob: Knob = GPU_FREQ_MHZ  # what the columns are (a LUT of another knob is another file)

    @classmethod
    def of(
        cls,
        device: Device,
        workload: Workload,
        batch_sizes: Sequence[int],
        *,
        limit: PowerLimit = NO_CAP,
        grid: str = "full",
    ) -> LUTKey:
        info = device.info
        return cls(
            info.kind,
            info.backend,
            workload,
            tuple(int(b) for b in batch_sizes),
            tuple(float(f) for f in device.knob_values),
            limit,
            grid,
            device_knob(device),
        )

    def path(self, cache_dir: str | os.PathLike[str]) -> Path:
        """Where this LUT is cached.

        The name is readable (kind, backend, workload key, B, ``full``/the grid or the cap
        and margin) and ends in a short hash of the exact key, so differently spelled
        names never share a file.
        """
        w = self.workload
        if not self.limit.capped:
            cap = self.grid
        else:
            cap = f"pmax{self.limit.p_max_w!r}w-margin{self.limit.cap_margin!r}"
        parts = [self.device_kind, self.backend, w.key, "b" + "-".join(map(str, self.batch_sizes))]
        fields: list[Any] = [
            self.device_kind,
            self.backend,
            w.model_name,
            list(w.input_shape),
            list(self.batch_sizes),
            self.limit.cap_w,
            self.limit.cap_margin,
            self.grid,
        ]
        if self.knob != GPU_FREQ_MHZ:  # frequency LUTs keep the names they always had
            parts.append(self.knob.setting)
            fields.append(self.knob.key)
        exact = json.dumps(fields)
        digest = hashlib.sha256(exact.encode()).hexdigest()[:10]
        readable = "_".join(re.sub(r"[^A-Za-z0-9.+-]+", "-", p) for p in [*parts, cap])
        return Path(cache_dir) / f"lut_{readable}_{digest}.json"

    def mismatch(self, lut: LUT) -> str | None:
        """Why ``lut`` does not fit this key (None if it does)."""
        expected: dict[str, tuple[object, object]] = {
            "device-kind": (lut.device_kind, self.device_kind),
            "backend": (lut.backend, self.backend),
            "model-name": (lut.model_name, self.workload.model_name),
            "input-shape": (lut.input_shape, tuple(self.workload.input_shape)),
            "batch-sizes": (lut.batch_sizes, self.batch_sizes),
            "knob": (lut.knob.key, self.knob.key),
            self.knob.values_key: (lut.knob_values, self.knob_values),
            "p-max-w": (lut.limit.cap_w, self.limit.cap_w),
            "cap-margin": (lut.limit.cap_margin, self.limit.cap_margin),
            "grid": (lut.grid, self.grid),
        }
        for key, (got, want) in expected.items():
            if got != want:
                return f"{key} is {got!r}, expected {want!r}"
        return None


def load_cached(path: Path, key: LUTKey) -> LUT | None:
    """The cached LUT at ``path`` if it is valid and fits ``key``; a bad file is set aside."""
    if not path.is_file():
        return None
    try:
        lut = LUT.load(path, require_checksum=True)
        reason = key.mismatch(lut)
    except (LUTFormatError, OSError) as err:
        reason = str(err)
    if reason is None:
        return lut
    kept = set_aside(path)
    log.warning(
        "LUT cache %s is corrupt or does not match (%s): %s; re-profiling", path, reason, kept
    )
    return None


def save_quietly(lut: LUT, path: Path) -> None:
    """Write a LUT to the cache; a cache that cannot be written only costs a warning."""
    try:
        lut.save(path)
    except OSError as err:
        log.warning("could not update the LUT cache %s (%s)", path, err)


# --------------------------------------------------------------------------- kinds


@dataclass(frozen=True)
class KindKey:
    """Nodes of one kind see the same LUT up to unit-to-unit spread: same device kind,
    backend, model, input shape, B and knob values. Fleet-shared profiling measures one
    LUT per kind (``grid="shared"``: no cap, the cells the kind's caps need)."""

    device_kind: str
    backend: str
    model_name: str
    input_shape: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    knob_values: tuple[float, ...]

    @classmethod
    def of_lut(cls, lut: LUT) -> KindKey:
        return cls(
            lut.device_kind,
            lut.backend,
            lut.model_name,
            tuple(lut.input_shape),
            tuple(lut.batch_sizes),
            tuple(lut.knob_values),
        )

    @property
    def label(self) -> str:
        """``jetson-nano/simulated/cnn-3x32x32/b4-8-16`` (readable, not unique on its own)."""
        shape = "x".join(map(str, self.input_shape))
        b = "-".join(map(str, self.batch_sizes))
        return f"{self.device_kind}/{self.backend}/{self.model_name}-{shape}/b{b}"

    @property
    def digest(self) -> str:
        exact = json.dumps(
            [
                self.device_kind,
                self.backend,
                self.model_name,
                list(self.input_shape),
                list(self.batch_sizes),
                list(self.knob_values),
            ]
        )
        return hashlib.sha256(exact.encode()).hexdigest()[:12]

    def differences(self, other: KindKey) -> list[str]:
        """What differs between two kinds, named (empty when they are the same kind)."""
        out = []
        for name in ("device_kind", "backend", "model_name", "input_shape", "batch_sizes"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                out.append(f"{name.replace('_', '-')} is {theirs!r}, expected {mine!r}")
        if self.knob_values != other.knob_values:
            out.append("freqs-mhz: the frequency tables differ")
        return out


def lut_checksum(lut: LUT) -> str:
    """SHA-256 of a LUT's canonical JSON: what a library file's content is checked against."""
    return hashlib.sha256(lut.to_json().encode()).hexdigest()
