"""Measuring one (batch size, GPU knob) cell as profiling does: a warm-up, then steps until
the device's power sensor has what it needs (``CellWindow``), the cell's time, peak and
average power and σ of its per-step peaks (``CellMeasurement``). No Flower import.

Each cell is measured for as long as its device's power sensor needs: at least ``steps``
steps, then on until the steps cover the sensor's window and hold its least number of power
samples and time and power have settled, up to a hard cap.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fl_client.devices.base import (
    EXACT_SENSOR,
    Device,
    DeviceError,
    Measurement,
    SensorSpec,
    Workload,
)

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
    def of(cls, device: Device, steps: int = 3) -> CellWindow:
        """The window of ``device``'s sensor (``DeviceInfo.sensor``): its least window and
        number of power samples, at least ``steps`` steps, the default settling and caps
        (``dataclasses.replace`` changes them)."""
        info = device.info
        sensor = getattr(info, "sensor", None)
        sensor = sensor if isinstance(sensor, SensorSpec) else EXACT_SENSOR
        board = getattr(info, "board_sensor", None)
        return cls(
            steps,
            sensor.min_window_s,
            sensor.min_power_samples,
            max_steps=max(MAX_STEPS_PER_CELL, steps),
            board=board if isinstance(board, SensorSpec) else None,
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


@dataclass(frozen=True)
class CellMeasurement:
    """One cell measured as ``profile`` measures it (``measure_cell_with_sigma``).

    It unpacks as the 4-tuple it always was (measurement, time, energy, σ); ``settled``
    (False: the cell stopped at a hard cap before its window, samples or settling were
    met), ``needed_window_s`` (the real board's window on an emulated device, else NaN)
    and ``time_rse`` are attributes, and so are ``window_s`` and ``power_samples`` of the
    measurement.
    """

    measurement: Measurement  # the measured steps
    time_s: float  # device time of the whole check, warm-up included (profiling cost)
    energy_j: float  # its energy
    peak_sigma_w: float  # σ of the measured steps' peaks (NaN: fewer than 2 steps)
    settled: bool = True
    needed_window_s: float = math.nan
    time_rse: float = math.nan

    def __post_init__(self) -> None:
        object.__setattr__(self, "settled", bool(self.settled))
        object.__setattr__(self, "needed_window_s", float(self.needed_window_s))
        object.__setattr__(self, "time_rse", float(self.time_rse))

    def __iter__(self) -> Iterator[Any]:
        """(measurement, time, energy, σ), as the tuple it was."""
        return iter((self.measurement, self.time_s, self.energy_j, self.peak_sigma_w))

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


def measure_locked(
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


@dataclass(frozen=True)
class CellOptions:
    """How one cell is measured on its own: ``warmup_steps`` run first (≥ 0; their time and
    energy are profiling cost), then at least ``steps`` steps, on as the device's sensor
    needs (``CellWindow.of(device, steps)``), or as ``window`` says when given."""

    warmup_steps: int = 1
    steps: int = 3
    window: CellWindow | None = None

    def window_on(self, device: Device) -> CellWindow:
        """The window a cell is measured by on ``device``."""
        return self.window if self.window is not None else CellWindow.of(device, self.steps)


def measure_cell_with_sigma(
    device: Device,
    workload: Workload,
    batch_size: int,
    step: Callable[[], object],
    knob_value: float,
    options: CellOptions | None = None,
) -> CellMeasurement:
    """Measure one (b, f) cell as ``profile`` does (warm-up, then at least ``steps`` steps,
    on as the device's sensor needs, or as the window ``options`` give says).

    Returns the measured steps' ``Measurement``, the device time and energy of the whole
    check (warm-up included), which is profiling cost, and σ of the measured steps' peak
    powers; ``settled`` and ``needed_window_s`` as attributes. The frequency is restored.
    """
    opts = options if options is not None else CellOptions()
    rule = opts.window_on(device)
    start_s = device.now_s()
    try:
        device.set_knob_value(knob_value)
        cell = measure_locked(device, workload, batch_size, step, opts.warmup_steps, rule)
    finally:
        device.restore()
    return dataclasses.replace(cell, time_s=max(device.now_s() - start_s, 0.0))


def measure_cell(
    device: Device,
    workload: Workload,
    batch_size: int,
    step: Callable[[], object],
    knob_value: float,
    options: CellOptions | None = None,
) -> tuple[Measurement, float, float]:
    """``measure_cell_with_sigma`` without σ: the measurement, device time and energy."""
    cell = measure_cell_with_sigma(device, workload, batch_size, step, knob_value, options)
    return cell.measurement, cell.time_s, cell.energy_j
