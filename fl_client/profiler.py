"""On-device profiling of LUT_time / LUT_power per (batch size, GPU frequency), with a disk cache.

Paper §4.1: for each profiled (b, f) lock the GPU at f, run a few real minibatches of the
model at b (warm-up discarded) and record time per sample, peak power and the σ of the
per-step peaks. Under a known P_max only the cells that matter are profiled (efficient
mode). Tables are cached per (device kind, backend, model, input shape, B, cap) by
``fl_client.lut``. No Flower import.

Each cell is measured for as long as its device's power sensor needs (``CellWindow``): at
least ``steps`` steps, then on until the steps cover the sensor's window and hold its
least number of power samples and time and power have settled, up to a hard cap.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np

from fl_client.devices.base import (
    EXACT_SENSOR,
    GPU_FREQ_MHZ,
    Device,
    DeviceError,
    Knob,
    Measurement,
    SensorSpec,
    Workload,
    device_knob,
)
from fl_client.lut import LUT, FloatArray, LUTKey, load_cached
from fl_client.power import PowerLimit, check_cap_margin, parse_p_max_w
from fl_client.selector import PEAK_SIGMA_K, feasible_cells, validate_batch_sizes

log = logging.getLogger(__name__)

StepFactory = Callable[[int], Callable[[], object]]


@dataclass(frozen=True)
class MeasureContext:
    """Where a node measures cells outside profiling (shared cells checked, drift checks):
    its device, the workload, the factory of its training step per batch size, and its LUT
    cache."""

    device: Device
    workload: Workload
    step_factory: StepFactory
    cache_dir: Path


# --------------------------------------------------------------------------- profiling


class _Progress:
    """A rich progress bar on a terminal, one plain line per cell otherwise, or nothing."""

    def __init__(
        self,
        enabled: bool,
        title: str,
        total: int | None,
        stream: IO[str],
        knob: Knob = GPU_FREQ_MHZ,
    ):
        self._stream = stream
        self._knob = knob
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

    def cell(self, b: int, freq_mhz: float, cell: CellMeasurement) -> None:
        self._done += 1
        if not self._enabled:
            return
        m = cell.measurement
        tps_ms = 1e3 * m.time_s / max(m.samples, 1)
        unsettled = "" if cell.settled else ", unsettled"
        clock_mhz = getattr(m, "clock_mhz", math.nan)
        ran_at = f", clock {clock_mhz:g} MHz" if math.isfinite(clock_mhz) else ""
        moved = " (moved)" if ran_at and getattr(m, "clock_moved", False) else ""
        what = (
            f"b={b} f={freq_mhz:g} {self._knob.unit}: {tps_ms:.3f} ms/sample, "
            f"peak {m.peak_power_w:.2f} W, avg {m.avg_power_w:.2f} W{ran_at}{moved} "
            f"({m.steps} steps, {cell.window_s:.3g} s, {cell.power_samples} samples"
            f"{unsettled})"
        )
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
) -> tuple[Measurement, list[float]]:
    """Run ``n`` steps in one measurement; it and each step's peak power (the highest power
    sample the step added; a step that added none has no peak)."""
    step_peaks_w: list[float] = []
    with device.measure(workload) as meter:
        seen = 0
        for _ in range(n):
            meter.step(batch_size, step)
            added = meter.power_samples_since(seen)
            seen += len(added)
            if added:
                step_peaks_w.append(max(added))
    return meter.measurement, step_peaks_w


#: Warm-up: after the asked-for steps, on until the mean step time of the last
#: ``WARMUP_BLOCK`` steps is within ``WARMUP_TOLERANCE`` of the block before (the first
#: steps of a model carry allocation and kernel selection), up to ``WARMUP_MAX_STEPS``
#: steps or ``WARMUP_MAX_S`` of device time.
WARMUP_BLOCK = 3
WARMUP_TOLERANCE = 0.1
WARMUP_MAX_STEPS = 200
WARMUP_MAX_S = 10.0


def warmup_stable(step_times_s: Sequence[float], block: int = WARMUP_BLOCK) -> bool:
    """Whether the last ``block`` step times average within ``WARMUP_TOLERANCE`` of the
    ``block`` before them."""
    if len(step_times_s) < 2 * block:
        return False
    last = sum(step_times_s[-block:]) / block
    before = sum(step_times_s[-2 * block : -block]) / block
    return abs(last - before) <= WARMUP_TOLERANCE * max(last, before)


def _on_emulated_clock(device: Device) -> bool:
    """Whether ``device`` reports modelled steps on an emulated clock (twin, replay table:
    a sensor that updates with every step), which model no warm-up transient."""
    sensor = getattr(device.info, "sensor", None)
    return not isinstance(sensor, SensorSpec) or sensor.update_period_s == 0


def _warm_up(
    device: Device, workload: Workload, batch_size: int, step: Callable[[], object], n: int
) -> tuple[Measurement, int]:
    """At least ``n`` steps (none when ``n`` is 0), then on a real device until the step
    time is stable (``warmup_stable``; an emulated clock models no warm-up, so its ``n``
    steps are all); the measurement and the number of steps run."""
    times_s: list[float] = []
    exact = _on_emulated_clock(device)
    with device.measure(workload) as meter:
        while n > 0:
            t0_s = meter.time_s
            meter.step(batch_size, step)
            t1_s = meter.time_s
            times_s.append(t1_s - t0_s)
            if len(times_s) >= n and (exact or warmup_stable(times_s)):
                break
            if len(times_s) >= n and (len(times_s) >= WARMUP_MAX_STEPS or t1_s >= WARMUP_MAX_S):
                break
    return meter.measurement, len(times_s)


def step_time_rse(step_times_s: Sequence[float]) -> float:
    """Relative standard error of the mean step time, by batch means: the steps split
    into batches of ⌊√n⌋ (successive host-timed steps are not independent: a queue of
    GPU work makes them bursty), the standard error of the batch means over the mean.
    inf with fewer than 2 batches; 0 (to rounding) for equal steps."""
    return time_sums_rse(list(itertools.accumulate(step_times_s)))


def time_sums_rse(time_sums: Sequence[float]) -> float:
    """``step_time_rse`` of the steps whose running sums are ``time_sums``, from ⌊√n⌋ + 1 of
    the sums: its cost grows with √n, so a cell judges it after every step without slowing
    the steps it measures."""
    n = len(time_sums)
    size = max(1, math.isqrt(n))
    k = n // size
    if k < 2:
        return math.inf
    start = n - k * size  # the first step of the first batch
    ends = [time_sums[start - 1] if start else 0.0]
    ends += [time_sums[start + (j + 1) * size - 1] for j in range(k)]
    means = np.diff(np.asarray(ends, dtype=np.float64)) / size
    mean = float(means.mean())
    if mean <= 0:
        return math.inf
    spread = float(np.std(means - means[0], ddof=1))
    return spread / math.sqrt(k) / mean


#: Hard caps of one cell: it stops at whichever comes first, marked unsettled (LUT
#: ``settled`` 0) unless its window, sample minimum and settling were all met. 30 s is 6×
#: the longest default sensor window (5 s: jtop at 1 s, NVML's 1 s average); 5000 steps
#: cover 30 s of 6 ms steps (a cell of faster steps stops at the step cap). A full grid of
#: ~70 cells stays under 35 minutes even if no cell settles.
MAX_STEPS_PER_CELL = 5000
MAX_WINDOW_S = 30.0
#: Settled: over the last quarter of the measured steps (at least one), the running mean
#: step time and the running mean per-step peak moved by at most this share of their
#: value. 2% is the selector's tie tolerance: a cell still moving by more is not settled.
SETTLE_TOLERANCE = 0.02
SETTLE_SHARE = 0.25
#: ... and the relative standard error of the mean step time (``step_time_rse``) is at most
#: this: a cell long enough for its sensor may still be too short for its time.
MAX_TIME_RSE = 0.01
#: How cells are sized: by the device's sensor (``sensor``, the default), or exactly
#: ``steps`` steps each as before sensors were considered (``fixed``).
SIZINGS = ("sensor", "fixed")


def _check_positive(key: str, value: object, *, integer: bool) -> None:
    """``value`` is an integer ≥ 1 (``integer``) or a number ≥ 0 (inf allowed); else a
    ValueError naming ``key``."""
    if integer:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    if not ok:
        what = "an integer ≥ 1" if integer else "a number ≥ 0"
        raise ValueError(f"{key}: must be {what}, got {value!r}")


@dataclass(frozen=True)
class CellWindow:
    """How long one cell is measured (after its warm-up).

    Steps are measured until all of: at least ``min_steps`` (the fixed count, ``steps``, is
    the lower bound), ``min_window_s`` of measured device time, ``min_power_samples``
    power samples in the measurement, and time and power settled (``settled``); or until
    ``max_steps`` steps or ``max_window_s`` of measured time, which marks the cell
    unsettled. Settled also needs the mean step time's relative standard error
    (``step_time_rse``) at most ``max_time_rse``. ``board``: the real board's sensor of an
    emulated device (twin, replay),
    whose window is reported per cell (``needed_window_s``), never charged.
    """

    min_steps: int = 3
    min_window_s: float = 0.0
    min_power_samples: int = 1
    settle_tolerance: float = SETTLE_TOLERANCE
    max_steps: int = MAX_STEPS_PER_CELL
    max_window_s: float = MAX_WINDOW_S
    board: SensorSpec | None = None
    max_time_rse: float = MAX_TIME_RSE

    def __post_init__(self) -> None:
        _check_positive("steps", self.min_steps, integer=True)
        _check_positive("min-window-s", self.min_window_s, integer=False)
        if math.isinf(self.min_window_s):
            raise ValueError("min-window-s: must be finite, got inf")
        if (
            isinstance(self.min_power_samples, bool)
            or not isinstance(self.min_power_samples, int)
            or self.min_power_samples < 0
        ):
            raise ValueError(
                f"min-power-samples: must be an integer ≥ 0, got {self.min_power_samples!r}"
            )
        tol = self.settle_tolerance
        if isinstance(tol, bool) or not isinstance(tol, int | float) or not tol > 0:
            raise ValueError(f"settle-tolerance: must be a number > 0 (inf: off), got {tol!r}")
        _check_positive("max-steps", self.max_steps, integer=True)
        _check_positive("max-window-s", self.max_window_s, integer=False)
        if self.max_steps < self.min_steps:
            raise ValueError(f"max-steps: must be ≥ steps ({self.min_steps}), got {self.max_steps}")

    @classmethod
    def fixed(cls, steps: int) -> CellWindow:
        """Exactly ``steps`` steps, nothing else judged (cells count as settled)."""
        return cls(steps, 0.0, 0, math.inf, steps, math.inf, max_time_rse=math.inf)

    @classmethod
    def of(
        cls,
        device: Device,
        steps: int = 3,
        *,
        min_window_s: float | None = None,
        min_power_samples: int | None = None,
        settle_tolerance: float = SETTLE_TOLERANCE,
        max_steps: int = MAX_STEPS_PER_CELL,
        max_window_s: float = MAX_WINDOW_S,
    ) -> CellWindow:
        """The window of ``device``'s sensor (``DeviceInfo.sensor``), the given minimums
        replacing the sensor's; ``max_steps`` is raised to ``steps`` if below it."""
        info = device.info
        sensor = getattr(info, "sensor", None)
        sensor = sensor if isinstance(sensor, SensorSpec) else EXACT_SENSOR
        board = getattr(info, "board_sensor", None)
        return cls(
            steps,
            sensor.min_window_s if min_window_s is None else min_window_s,
            sensor.min_power_samples if min_power_samples is None else min_power_samples,
            settle_tolerance,
            max(max_steps, steps),
            max_window_s,
            board if isinstance(board, SensorSpec) else None,
        )

    def needed_window_s(self, m: Measurement) -> float:
        """The window the real board's sensor (``board``) would need for this cell at the
        measured step time: NaN without a board or a measured step."""
        if self.board is None or m.steps < 1:
            return math.nan
        return self.board.window_for(m.time_s / m.steps, m.steps)


def _settled(cumulative: Sequence[float], tolerance: float) -> bool:
    """Whether a running mean (of the values whose running sums are ``cumulative``) moved
    by at most ``tolerance`` of its value over the last ``SETTLE_SHARE`` of them (at
    least one); fewer than 2 values: nothing to judge, settled."""
    n = len(cumulative)
    if n < 2 or math.isinf(tolerance):
        return True
    k = min(max(1, math.ceil(SETTLE_SHARE * n)), n - 1)
    now, before = cumulative[-1] / n, cumulative[n - k - 1] / (n - k)
    return abs(now - before) <= tolerance * abs(now)


def _run_cell(
    device: Device,
    workload: Workload,
    batch_size: int,
    step: Callable[[], object],
    window: CellWindow,
) -> tuple[Measurement, list[float], bool, float]:
    """Measure steps as ``window`` says in one measurement; it, each step's peak power (as
    ``_run_steps``), whether the cell settled (False: it stopped at a hard cap) and the
    relative standard error of its mean step time."""
    step_peaks_w: list[float] = []
    time_sums: list[float] = []  # running sums of the step times
    peak_sums: list[float] = []  # ... and of the step peaks
    settled = False
    seen = 0  # power samples in the window so far
    with device.measure(workload) as meter:
        t1_s = meter.time_s
        while True:
            t0_s = t1_s
            meter.step(batch_size, step)
            t1_s = meter.time_s
            added = meter.power_samples_since(seen)
            seen += len(added)
            if added:
                step_peaks_w.append(max(added))
                peak_sums.append((peak_sums[-1] if peak_sums else 0.0) + step_peaks_w[-1])
            time_sums.append((time_sums[-1] if time_sums else 0.0) + (t1_s - t0_s))
            n = len(time_sums)
            if n < window.min_steps:
                continue
            tol = window.settle_tolerance
            if (
                t1_s >= window.min_window_s * (1 - 1e-9)  # a sum of steps may round below
                and seen >= window.min_power_samples
                and _settled(time_sums, tol)
                and _settled(peak_sums, tol)
                and time_sums_rse(time_sums) <= window.max_time_rse
            ):
                settled = True
                break
            if n >= window.max_steps or t1_s >= window.max_window_s:
                break
    return meter.measurement, step_peaks_w, settled, time_sums_rse(time_sums)


def peak_sigma_w(step_peaks_w: Sequence[float]) -> float:
    """σ of a cell's per-step peak powers (sample standard deviation, ddof = 1); NaN (not
    recorded: the selector counts it as 0) with fewer than 2 steps."""
    if len(step_peaks_w) < 2:
        return math.nan
    peaks = np.asarray(step_peaks_w, dtype=np.float64)
    return float(np.std(peaks - peaks[0], ddof=1))  # shifted: equal peaks give exactly 0


def time_per_sample_s(m: Measurement, batch_size: int, steps: int) -> float:
    """A measurement's time per sample (the samples it counted, else ``batch_size × steps``)."""
    return m.time_s / (m.samples if m.samples > 0 else batch_size * steps)


#: The tables ``profile`` fills, by LUT field: time, peak, average power and σ, and what
#: each cell's measurement was (power samples, window, settled, the board's window).
_TABLES = {
    "time": "time_per_sample_s",
    "peak": "peak_power_w",
    "avg": "avg_power_w",
    "sigma": "peak_sigma_w",
    "samples": "power_samples",
    "window": "window_s",
    "settled": "settled",
    "needed": "needed_window_s",
    "rse": "time_rse",
    "clock": "clock_mhz",
    "moved": "clock_moved",
    "counter": "energy_from_counter",
}


def _new_tables(shape: tuple[int, int]) -> dict[str, FloatArray]:
    """Empty (all NaN) tables of a (|B|, |F|) grid (``_TABLES``)."""
    return {name: np.full(shape, np.nan) for name in _TABLES}


def _record(
    tables: dict[str, FloatArray], i: int, j: int, cell: CellMeasurement, batch_size: int
) -> None:
    """Write one measured cell into ``_new_tables``' tables."""
    m = cell.measurement
    tables["time"][i, j] = time_per_sample_s(m, batch_size, m.steps)
    tables["peak"][i, j] = m.peak_power_w
    tables["avg"][i, j] = m.avg_power_w
    tables["sigma"][i, j] = cell.peak_sigma_w
    tables["samples"][i, j] = cell.power_samples
    tables["window"][i, j] = cell.window_s
    tables["settled"][i, j] = 1.0 if cell.settled else 0.0
    tables["needed"][i, j] = cell.needed_window_s
    tables["rse"][i, j] = cell.time_rse if math.isfinite(cell.time_rse) else math.nan
    clock_mhz = getattr(m, "clock_mhz", math.nan)
    if math.isfinite(clock_mhz):  # a real sensor's cell: the clock sampled while it ran
        tables["clock"][i, j] = clock_mhz
        tables["moved"][i, j] = 1.0 if getattr(m, "clock_moved", False) else 0.0
    source = getattr(m, "energy_source", "")
    if source:
        tables["counter"][i, j] = 1.0 if source == "counter" else 0.0


def _lut_of(
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    tables: dict[str, FloatArray],
    **fields: Any,
) -> LUT:
    """The LUT of ``tables`` measured on ``device`` (its frequency table as columns)."""
    info = device.info
    by_field: dict[str, Any] = {field: tables[name] for name, field in _TABLES.items()}
    locked = getattr(device, "clocks_locked", None)
    return LUT(
        device_kind=info.kind,
        backend=info.backend,
        model_name=workload.model_name,
        input_shape=tuple(workload.input_shape),
        batch_sizes=tuple(batch_sizes),
        freqs_mhz=tuple(float(f) for f in device.gpu_freqs_mhz),
        knob=device_knob(device),
        clocks_locked=locked if isinstance(locked, bool) else None,
        **by_field,
        **fields,
    )


#: Efficient mode: a batch size's walk up in f stops at this many infeasible cells in a row
#: (one noisy cell above the cap does not end it; two in a row mark the boundary).
WALK_STOP_IN_A_ROW = 2
#: ... and at the latest at this many infeasible cells beyond the first one of the walk
#: (isolated ones included), which bounds what noise can cost.
WALK_EXTRA_INFEASIBLE = 2


def _efficient_row(feasible: Callable[[int], bool], start: int, n_f: int) -> int | None:
    """Walk one batch size's frequencies for efficient mode; its highest feasible index.

    Up from ``start`` (``feasible`` measures each index it is asked about) until
    ``WALK_STOP_IN_A_ROW`` infeasible indices in a row, or ``1 + WALK_EXTRA_INFEASIBLE``
    infeasible ones in all, or the top of the table; if none of those was feasible, down
    from ``start − 1`` until a feasible one.
    """
    highest = None
    in_a_row = infeasible = 0
    j = start
    while j < n_f:
        if feasible(j):
            highest, in_a_row = j, 0
        else:
            in_a_row, infeasible = in_a_row + 1, infeasible + 1
            if in_a_row >= WALK_STOP_IN_A_ROW or infeasible > WALK_EXTRA_INFEASIBLE:
                break
        j += 1
    if highest is None:
        for k in range(start - 1, -1, -1):
            if feasible(k):
                return k
    return highest


@dataclass(frozen=True)
class ProfileOptions:
    """How to profile: the cap (efficient mode), steps per cell, progress, uncapped grid.

    ``p_max_w`` is the bare cap (None, "none" or inf: no cap) and ``cap_margin`` the share
    of it kept free: efficient mode judges each cell as the selector does, by its robust
    peak (peak + ``peak_sigma_k``·σ of its per-step peaks) against
    ``p_max_w · (1 − cap_margin)``. The cap and margin are stored in the LUT as such;
    ``peak_sigma_k`` (the run setting ``peak-sigma-k``) only steers where the walk stops.

    ``steps`` is the least number of measured steps per cell; with ``sizing="sensor"``
    (the default) a cell goes on until the device's sensor window and sample minimum
    (``min_window_s`` / ``min_power_samples`` replace the sensor's when given) are met
    and time and power settled within ``settle_tolerance``, up to ``max_steps`` steps or
    ``max_window_s`` seconds (``CellWindow``); ``sizing="fixed"``: exactly ``steps``.
    """

    p_max_w: float | str | None = None
    cap_margin: float = 0.0
    warmup_steps: int = 1
    steps: int = 3
    progress: bool = True
    progress_stream: IO[str] | None = None
    uncapped: str = "full"
    peak_sigma_k: float = PEAK_SIGMA_K
    sizing: str = "sensor"
    min_window_s: float | None = None
    min_power_samples: int | None = None
    settle_tolerance: float = SETTLE_TOLERANCE
    max_steps: int = MAX_STEPS_PER_CELL
    max_window_s: float = MAX_WINDOW_S

    def cell_window(self, device: Device) -> CellWindow:
        """How each cell is measured on ``device``."""
        if self.sizing == "fixed":
            return CellWindow.fixed(self.steps)
        return CellWindow.of(
            device,
            self.steps,
            min_window_s=self.min_window_s,
            min_power_samples=self.min_power_samples,
            settle_tolerance=self.settle_tolerance,
            max_steps=self.max_steps,
            max_window_s=self.max_window_s,
        )

    def __post_init__(self) -> None:
        watts = parse_p_max_w(self.p_max_w)
        cap = None if math.isinf(watts) else watts
        object.__setattr__(self, "p_max_w", cap)
        warmup = self.warmup_steps
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup-steps: must be an integer ≥ 0; got {warmup!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps: must be an integer ≥ 1; got {self.steps!r}")
        if self.uncapped not in ("full", "highest"):
            raise ValueError(f"uncapped: unknown value {self.uncapped!r}; allowed: full, highest")
        check_cap_margin(self.cap_margin)
        k = self.peak_sigma_k
        if isinstance(k, bool) or not isinstance(k, int | float) or not 0 <= k < math.inf:
            raise ValueError(f"peak-sigma-k: expected a finite number ≥ 0, got {k!r}")
        if self.sizing not in SIZINGS:
            raise ValueError(
                f"sizing: unknown value {self.sizing!r}; allowed: {', '.join(SIZINGS)}"
            )
        CellWindow(  # the window's own checks, with a device's minimums left to it
            self.steps,
            0.0 if self.min_window_s is None else self.min_window_s,
            0 if self.min_power_samples is None else self.min_power_samples,
            self.settle_tolerance,
            max(self.max_steps, self.steps),
            self.max_window_s,
        )
        if cap is None:
            object.__setattr__(self, "cap_margin", 0.0)

    @property
    def cap_w(self) -> float | None:
        return None if self.p_max_w is None else float(self.p_max_w)

    @classmethod
    def under(cls, limit: PowerLimit, **options: Any) -> ProfileOptions:
        """Options for efficient mode under ``limit`` (the cap with its margin)."""
        return cls(p_max_w=limit.p_max_w, cap_margin=limit.cap_margin, **options)

    @property
    def limit(self) -> PowerLimit:
        """The cap with its margin, what a profiled cell's robust peak must stay below."""
        cap = math.inf if self.p_max_w is None else float(self.p_max_w)
        return PowerLimit(cap, self.cap_margin)

    def feasible(self, peak_w: float, sigma_w: float) -> bool:
        """Whether a cell is feasible by its robust peak, as the selector judges it."""
        return bool(
            feasible_cells(
                np.array([peak_w]),
                self.limit,
                peak_sigma_w=np.array([sigma_w]),
                peak_sigma_k=self.peak_sigma_k,
            )[0]
        )

    @property
    def grid(self) -> str:
        return "efficient" if self.cap_w is not None else self.uncapped


def profile(
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    step_factory: StepFactory,
    options: ProfileOptions | None = None,
    **settings: Any,
) -> LUT:
    """Measure LUT_time and LUT_power of ``workload`` on ``device`` (paper §4.1).

    For each profiled (b, f): lock the GPU at f, run ``warmup_steps`` steps (accounted for
    in the profiling cost, not in the tables), then at least ``steps`` steps through
    ``device.measure``, on until the device's sensor window and sample minimum are met and
    time and power settled (``options.cell_window``, ``CellWindow``); record time per
    sample, peak and average power, and per cell the power samples, the measured window,
    whether it settled and, on an emulated device of a real board, the window that board
    would have needed. The device is restored at the end whatever happens.

    Without a cap every cell is profiled. With ``p_max_w`` (efficient mode) each cell is
    judged as the selector judges it (``selector.feasible_cells``): feasible when its peak
    + ``peak_sigma_k``·σ of its per-step peaks is below ``p_max_w · (1 − cap_margin)``.
    The largest b goes from the lowest f upward and stops at the second infeasible f in a
    row (``WALK_STOP_IN_A_ROW``), both measured and recorded: one noisy cell above the cap
    (a spike at the lowest f, or a knob that does not bind there) does not end the walk,
    since the selector may still choose the feasible cells above it. Each next smaller b
    starts at the previous b's highest feasible f (the lowest f if it had none) and goes up
    the same way. Should nothing from that start up be feasible (power not monotone in b),
    the b walks down from below the start until a feasible f, so its highest feasible f
    below the start is still found. Cells never visited stay NaN.

    **Bound on extra cells.** Compared with stopping at the first infeasible f (the paper's
    walk), each b's walk up measures at most ``WALK_EXTRA_INFEASIBLE`` = 2 more infeasible
    cells beyond its first infeasible one: it stops at the second in a row, and at the
    third in all even when they are apart. Every other cell it measures is feasible, a
    cell the selector may choose. So per b at most 3 measured cells are infeasible on the
    way up, and on a row whose power rises with f the walk costs exactly one cell more than
    the paper's (the confirming second infeasible f, when the row has one). On such tables
    it finds, per b, the same highest feasible f as the full grid.

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
    options : ProfileOptions, optional
        ``p_max_w`` (the cap for efficient mode; None / "none" / infinity: no cap) and
        ``cap_margin``; ``peak_sigma_k`` (the selector's ``peak-sigma-k``, how efficient
        mode judges a cell); ``warmup_steps`` per cell run first and discarded (≥ 0),
        ``steps`` the least measured per cell (≥ 1; σ of the per-step peaks needs ≥ 2,
        else it is not recorded); ``sizing``, ``min_window_s``, ``min_power_samples``,
        ``settle_tolerance``, ``max_steps``, ``max_window_s``: how long each cell is
        measured beyond that (``ProfileOptions``, ``CellWindow``); ``progress`` (rich bar
        on a terminal, plain lines otherwise; False: silent) to ``progress_stream``
        (default ``sys.stderr``); ``uncapped``: without a cap profile every cell
        (``full``) or each b at the highest
        frequency only (``highest``, what Eq. 4 selects per b when nothing is infeasible).
    **settings
        ``ProfileOptions`` fields, to build ``options`` from keywords instead.

    Returns
    -------
    LUT
        With ``profile_time_s`` the device time (``device.now_s()``) profiling took, σ of
        the per-step peaks of every measured cell (``peak_sigma_w``), the per-cell
        ``power_samples``, ``window_s``, ``settled`` and ``needed_window_s``, and the
        device's knob.
    """
    opts = options if options is not None else ProfileOptions(**settings)
    b_list = validate_batch_sizes(batch_sizes)
    tables = _new_tables((len(b_list), len(device.gpu_freqs_mhz)))
    bar = _profile_bar(opts, device, workload, (len(b_list), len(device.gpu_freqs_mhz)))
    start_s = device.now_s()
    try:
        energy_j = _profile_rows(device, workload, b_list, step_factory, opts, tables, bar)
    finally:
        bar.close()
        device.restore()
    return _lut_of(
        device,
        workload,
        b_list,
        tables,
        p_max_w=opts.cap_w,
        cap_margin=opts.cap_margin,
        profile_time_s=max(device.now_s() - start_s, 0.0),
        profile_energy_j=energy_j,
        warmup_steps=opts.warmup_steps,
        steps=opts.steps,
        grid=opts.grid,
    )


def _profile_bar(
    opts: ProfileOptions, device: Device, workload: Workload, shape: tuple[int, int]
) -> _Progress:
    """Progress of one ``profile`` call, titled with its mode."""
    if opts.grid == "efficient":
        margin = f" less {100 * opts.cap_margin:g}%" if opts.cap_margin else ""
        mode = f"efficient, P_max {opts.cap_w:g} W{margin}"
    else:
        mode = {"full": "full grid", "highest": "no cap: highest frequency per b"}[opts.grid]
    return _Progress(
        opts.progress,
        f"profile {device.info.kind} {workload.key} ({mode})",
        {"full": shape[0] * shape[1], "highest": shape[0]}.get(opts.grid),
        opts.progress_stream if opts.progress_stream is not None else sys.stderr,
        device_knob(device),
    )


def _profile_rows(
    device: Device,
    workload: Workload,
    b_list: list[int],
    step_factory: StepFactory,
    opts: ProfileOptions,
    tables: dict[str, FloatArray],
    bar: _Progress,
) -> float:
    """Walk the rows as ``profile`` describes, largest b first; returns the energy spent."""
    freqs = tuple(float(f) for f in device.gpu_freqs_mhz)
    window = opts.cell_window(device)
    energy_j = 0.0
    start_j = 0  # efficient mode: where the next (smaller) b starts
    for i in reversed(range(len(b_list))):
        b = b_list[i]
        step = step_factory(b)

        def cell(j: int, i: int = i, b: int = b, step: Callable[[], object] = step) -> bool:
            """Profile (b, freqs[j]) into the tables; whether it is feasible (robust peak
            below the cap less its margin; always without a cap)."""
            nonlocal energy_j
            device.set_gpu_freq_mhz(freqs[j])
            measured = _measure_locked(device, workload, b, step, opts.warmup_steps, window)
            energy_j += measured.energy_j
            _record(tables, i, j, measured, b)
            bar.cell(b, freqs[j], measured)
            return opts.feasible(measured.measurement.peak_power_w, measured.peak_sigma_w)

        if opts.grid == "full":
            for j in range(len(freqs)):
                cell(j)
        elif opts.grid == "highest":
            cell(len(freqs) - 1)
        else:
            highest = _efficient_row(cell, start_j, len(freqs))
            start_j = 0 if highest is None else highest
        del cell, step  # free this b's model before the next one is built
    return energy_j


def load_or_profile(
    device: Device,
    workload: Workload,
    batch_sizes: Sequence[int],
    step_factory: StepFactory,
    cache_dir: str | os.PathLike[str],
    options: ProfileOptions | None = None,
    **settings: Any,
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
    device, workload, batch_sizes, step_factory, options, settings
        As in ``profile``; without a cap it profiles (and caches) the full grid, or with
        ``uncapped="highest"`` the highest frequency of each b.
    cache_dir : path
        Folder of the cache files (created if needed).

    Returns
    -------
    (LUT, bool)
        The tables, and whether they came from the cache (no profiling cost this time).
    """
    opts = options if options is not None else ProfileOptions(**settings)
    b_list = validate_batch_sizes(batch_sizes)
    wanted = [LUTKey.of(device, workload, b_list)]  # a full grid serves any cap
    if opts.cap_w is not None:
        wanted.append(
            LUTKey.of(
                device,
                workload,
                b_list,
                p_max_w=opts.cap_w,
                cap_margin=opts.cap_margin,
                grid="efficient",
            )
        )
    elif opts.uncapped == "highest":
        wanted.append(LUTKey.of(device, workload, b_list, grid="highest"))
    for key in wanted:
        path = key.path(cache_dir)
        cached = load_cached(path, key)
        if cached is not None:
            return cached, True
    lut = profile(device, workload, b_list, step_factory, opts)
    try:
        lut.save(path)  # the last path tried: the full grid's, or this cap's
    except OSError as err:
        log.warning("could not write the LUT cache %s (%s); profiling again next time", path, err)
    return lut, False


class _Cell(NamedTuple):
    measurement: Measurement  # the measured steps
    time_s: float  # device time of the whole check, warm-up included (profiling cost)
    energy_j: float  # its energy
    peak_sigma_w: float  # σ of the measured steps' peaks (NaN: fewer than 2 steps)


class CellMeasurement(_Cell):
    """One cell measured as ``profile`` measures it (``measure_cell_with_sigma``).

    It unpacks as the 4-tuple it always was (measurement, time, energy, σ); ``settled``
    (False: the cell stopped at a hard cap before its window, samples or settling were
    met) and ``needed_window_s`` (the real board's window on an emulated device, else
    NaN) are attributes, and so are ``window_s`` and ``power_samples`` of the measurement.
    """

    settled: bool
    needed_window_s: float
    time_rse: float

    def __new__(
        cls,
        measurement: Measurement,
        time_s: float,
        energy_j: float,
        peak_sigma_w: float,
        settled: bool = True,
        needed_window_s: float = math.nan,
        time_rse: float = math.nan,
    ) -> CellMeasurement:
        self = super().__new__(cls, measurement, time_s, energy_j, peak_sigma_w)
        object.__setattr__(self, "settled", bool(settled))
        object.__setattr__(self, "needed_window_s", float(needed_window_s))
        object.__setattr__(self, "time_rse", float(time_rse))
        return self

    @property
    def window_s(self) -> float:
        """The measured window: device time of the measured steps (no warm-up)."""
        return self.measurement.time_s

    @property
    def power_samples(self) -> int:
        """How many power samples the measured steps hold."""
        return len(self.measurement.power_samples_w)


#: A power reading unchanged for this long (or ``STUCK_UPDATES`` sensor updates, if
#: longer) in a cell is a stuck sensor: the cell is measured again, then refused.
STUCK_MIN_S = 1.0
STUCK_UPDATES = 10


def _cell_problem(device: Device, m: Measurement) -> str | None:
    """Why a measured cell cannot be used (a failed sensor read, a stuck reading), or None."""
    errors = getattr(m, "read_errors", 0)
    if errors:
        return f"{errors} sensor read(s) failed: {getattr(m, 'read_error', '')}"
    stuck_s = getattr(m, "stuck_s", 0.0)
    sensor = getattr(device.info, "sensor", None)
    update_s = sensor.update_period_s if isinstance(sensor, SensorSpec) else 0.0
    limit_s = max(STUCK_MIN_S, STUCK_UPDATES * update_s)
    if stuck_s >= limit_s:
        return (
            f"the power reading did not change for {stuck_s:.2f} s "
            f"(a stuck sensor: its readings change every {update_s:g} s)"
        )
    return None


def _measure_locked(
    device: Device,
    workload: Workload,
    batch_size: int,
    step: Callable[[], object],
    warmup_steps: int,
    window: CellWindow,
) -> CellMeasurement:
    """Warm-up (``_warm_up``), then the cell's steps as ``window`` says, at the frequency
    set now; the time and energy are those of both (no frequency change, no restore).

    A cell with a failed sensor read or a stuck reading (``_cell_problem``) is measured
    again; a second one in a row stops profiling (DeviceError naming what failed)."""
    start_s = device.now_s()
    energy_j = 0.0
    if warmup_steps:
        energy_j += _warm_up(device, workload, batch_size, step, warmup_steps)[0].energy_j
    for attempt in (1, 2):
        m, step_peaks_w, settled, rse = _run_cell(device, workload, batch_size, step, window)
        energy_j += m.energy_j
        problem = _cell_problem(device, m)
        if problem is None:
            break
        if attempt == 2:
            raise DeviceError(
                f"profiling stopped at b={batch_size} on {device.info.kind}: twice in a row "
                f"{problem}"
            )
        log.warning("profile b=%d: %s; measuring the cell again", batch_size, problem)
    return CellMeasurement(
        m,
        max(device.now_s() - start_s, 0.0),
        energy_j,
        peak_sigma_w(step_peaks_w),
        settled,
        window.needed_window_s(m),
        rse,
    )


def measure_cell_with_sigma(
    device: Device,
    workload: Workload,
    batch_size: int,
    step: Callable[[], object],
    freq_mhz: float,
    *,
    warmup_steps: int = 1,
    steps: int = 3,
    window: CellWindow | None = None,
) -> CellMeasurement:
    """Measure one (b, f) cell as ``profile`` does (warm-up, then at least ``steps`` steps,
    on as the device's sensor needs: ``CellWindow.of(device, steps)``, or ``window``).

    Returns the measured steps' ``Measurement``, the device time and energy of the whole
    check (warm-up included), which is profiling cost, and σ of the measured steps' peak
    powers; ``settled`` and ``needed_window_s`` as attributes. The frequency is restored.
    """
    rule = window if window is not None else CellWindow.of(device, steps)
    start_s = device.now_s()
    try:
        device.set_gpu_freq_mhz(freq_mhz)
        cell = _measure_locked(device, workload, batch_size, step, warmup_steps, rule)
    finally:
        device.restore()
    return CellMeasurement(
        cell.measurement,
        max(device.now_s() - start_s, 0.0),
        cell.energy_j,
        cell.peak_sigma_w,
        cell.settled,
        cell.needed_window_s,
        cell.time_rse,
    )


def measure_cell(*args: Any, **kwargs: Any) -> tuple[Measurement, float, float]:
    """``measure_cell_with_sigma`` (same parameters) without σ: the measurement, device
    time and energy."""
    cell = measure_cell_with_sigma(*args, **kwargs)
    return cell.measurement, cell.time_s, cell.energy_j
