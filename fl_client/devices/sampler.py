"""Power sampling on real hardware: a sampler thread, energy by integration, the meter.

The hardware backends (``jetson``, ``nvml``) share one wall-clock Meter and one base class
(``SampledDevice``) built here. A measurement is one window over steps run back to back, as
training runs them: a background thread samples power (default 20 Hz; the paper's 1 Hz
missed short peaks), the energy counter where the device has one, and the clock; the
training thread reads no sensor and adds no synchronize. Energy is the counter's over the
window where there is one (its updates placed in time, ``counter_energy_j``), else the
trapezoidal integral of the sampled power over exactly the window's time. The sampler
feeds each sample to the cap guard armed around training (``fl_client.devices.guard``).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from fl_client.devices.base import Measurement, Workload
from fl_client.devices.guard import (
    DEFAULT_CAP_WINDOW_S,
    CapGuard,
    CapGuarded,
    with_guard_figures,
)

if TYPE_CHECKING:
    from fl_client.devices.safety import GpuStateRecord

log = logging.getLogger(__name__)

DEFAULT_SAMPLE_RATE_HZ = 20.0

PowerReader = Callable[[], float]
Clock = Callable[[], float]


def integrate_energy_j(times_s: Sequence[float], powers_w: Sequence[float]) -> float:
    """Energy in joules of a sampled power trace, by the trapezoidal rule over time stamps."""
    if len(times_s) != len(powers_w):
        raise ValueError(f"{len(times_s)} time stamps for {len(powers_w)} power samples")
    return sum(
        0.5 * (powers_w[i] + powers_w[i + 1]) * (times_s[i + 1] - times_s[i])
        for i in range(len(times_s) - 1)
    )


def validate_rate_hz(rate_hz: float, key: str = "sample-rate-hz") -> float:
    ok = isinstance(rate_hz, int | float) and not isinstance(rate_hz, bool)
    if not (ok and math.isfinite(rate_hz) and rate_hz > 0):
        raise ValueError(f"{key}: must be a number of samples per second > 0, got {rate_hz!r}")
    return float(rate_hz)


@dataclass(frozen=True)
class WindowStats:
    """Power over one time window: energy, highest power, and the samples inside."""

    energy_j: float
    peak_power_w: float
    powers_w: tuple[float, ...]


class SensorReadError(RuntimeError):
    """A power, energy or clock read failed; the message names the call and the device."""


@dataclass(frozen=True)
class SensorReaders:
    """What the sampler thread reads: power (W) with every sample, the device's energy
    counter (J; None: it has none) with every sample too, and the GPU clock (MHz; None: not
    read) with every ``clock_every``-th. ``clock_step_mhz`` is the smallest step of the
    device's clock table (0: unknown): a window whose sampled clock moves by more is flagged
    (``PowerMeasurement.clock_moved``)."""

    read_power_w: PowerReader
    read_energy_j: Callable[[], float] | None = None
    read_clock_mhz: Callable[[], float] | None = None
    clock_every: int = 4
    clock_step_mhz: float = 0.0


@dataclass(frozen=True)
class SampledOptions:
    """What every sampled hardware backend (jetson, nvml) takes alike: power samples per
    second, how long sampled power may stay above P_max before the cap guard steps the GPU
    down (``cap_window_s``), and where the state file of the GPU settings it changes is kept
    (None: ``$POWERFL_STATE_DIR``, else ``~/.cache/powerfl/state``)."""

    state_dir: str | os.PathLike[str] | None = None
    sample_rate_hz: float = DEFAULT_SAMPLE_RATE_HZ
    cap_window_s: float = DEFAULT_CAP_WINDOW_S


@dataclass(frozen=True)
class SampleSeries:
    """What the sampler read, in time order: power (W) at every sample, the energy counter
    (J, NaN without one) and the clock (MHz, NaN where not read) at the samples that read
    them."""

    times_s: tuple[float, ...]
    powers_w: tuple[float, ...]
    energies_j: tuple[float, ...]
    clocks_mhz: tuple[float, ...]


class PowerSampler:
    """Samples ``readers.read_power_w`` at ``rate_hz`` in a daemon thread, keeping (time,
    power) pairs.

    ``readers.read_energy_j`` (a device's energy counter) is read with every sample and
    ``readers.read_clock_mhz`` with every ``clock_every``-th, both in the same thread, so the
    training thread never reads a sensor. ``clock`` and the readers are injectable so tests
    run on a synthetic trace; ``on_sample(t_s, power_w)`` (e.g. the cap guard) is called
    after each sample. A failed read is counted (``read_errors``), the first failure's
    message kept (``first_error``), and the sample skipped: the thread lives on.
    """

    def __init__(
        self,
        readers: SensorReaders,
        *,
        rate_hz: float = DEFAULT_SAMPLE_RATE_HZ,
        clock: Clock = time.monotonic,
        on_sample: Callable[[float, float], None] | None = None,
    ) -> None:
        self.rate_hz = validate_rate_hz(rate_hz)
        self.readers = readers
        self._read = readers.read_power_w
        self._read_energy = readers.read_energy_j
        self._read_clock = readers.read_clock_mhz
        self._clock_every = max(int(readers.clock_every), 1)
        self._clock = clock
        self._on_sample = on_sample
        self._lock = threading.Lock()
        self._times_s: list[float] = []
        self._powers_w: list[float] = []
        self._energies_j: list[float] = []
        self._clocks_mhz: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.read_errors = 0
        self.first_error = ""

    # -- sampling
    def sample(self) -> tuple[float, float]:
        """Take one sample now (any thread) and return ``(t_s, power_w)``.

        The sensor is read outside the lock, so a thread reading the samples (the training
        loop, after each step) never waits for a sensor read (an NVML call may take a
        millisecond); the lock only guards the appends, and times never go back."""
        t_s = self._clock()
        power_w = float(self._read())
        energy_j = float(self._read_energy()) if self._read_energy is not None else math.nan
        clock_mhz = math.nan
        if self._read_clock is not None and len(self._times_s) % self._clock_every == 0:
            clock_mhz = float(self._read_clock())
        with self._lock:
            if self._times_s and t_s < self._times_s[-1]:  # two threads sampled at once
                t_s = self._times_s[-1]
            self._times_s.append(t_s)
            self._powers_w.append(power_w)
            self._energies_j.append(energy_j)
            self._clocks_mhz.append(clock_mhz)
        if self._on_sample is not None:
            self._on_sample(t_s, power_w)
        return t_s, power_w

    def try_sample(self) -> tuple[float, float] | None:
        """``sample()``, but a failed read is counted, logged (once) and skipped."""
        try:
            return self.sample()
        except Exception as err:  # the sampler thread must live on; the meter reports it
            self.read_errors += 1
            if self.read_errors == 1:
                self.first_error = str(err) or type(err).__name__
                log.warning("power sensor read failed (%s); skipping samples", err)
            return None

    def now_s(self) -> float:
        return self._clock()

    def _run(self) -> None:
        interval_s = 1.0 / self.rate_hz
        while not self._stop.wait(interval_s):
            self.try_sample()

    def start(self) -> PowerSampler:
        if self._thread is not None:
            return self
        self._stop.clear()
        self.try_sample()
        self._thread = threading.Thread(target=self._run, name="powerfl-power", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (waits for it) and take a last sample."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=max(5.0, 5.0 / self.rate_hz))
        self._thread = None
        self.try_sample()

    @property
    def running(self) -> bool:
        return self._thread is not None

    def __enter__(self) -> PowerSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- results
    def powers_between(self, t0_s: float, t1_s: float, start: int = 0) -> list[float]:
        """The powers read at times in ``[t0_s, t1_s]``, from the ``start``-th of them on. The
        times only grow, so the cost is two binary searches and the slice returned."""
        with self._lock:
            times_s = self._times_s
            a = bisect.bisect_left(times_s, t0_s)
            b = bisect.bisect_right(times_s, t1_s, lo=a)
            return self._powers_w[a + start : b]

    @property
    def trace(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Time stamps (s) and powers (W) kept so far."""
        with self._lock:
            return tuple(self._times_s), tuple(self._powers_w)

    @property
    def series(self) -> SampleSeries:
        """Everything read so far (``SampleSeries``)."""
        with self._lock:
            return SampleSeries(
                tuple(self._times_s),
                tuple(self._powers_w),
                tuple(self._energies_j),
                tuple(self._clocks_mhz),
            )

    @property
    def energy_j(self) -> float:
        times_s, powers_w = self.trace
        return integrate_energy_j(times_s, powers_w)

    @property
    def peak_power_w(self) -> float:
        return max(self.trace[1], default=0.0)

    @property
    def duration_s(self) -> float:
        times_s = self.trace[0]
        return times_s[-1] - times_s[0] if len(times_s) > 1 else 0.0

    @property
    def avg_power_w(self) -> float:
        duration_s = self.duration_s
        return self.energy_j / duration_s if duration_s > 0 else 0.0

    def window(self, t0_s: float, t1_s: float) -> WindowStats:
        """Power over ``[t0_s, t1_s]``, interpolating linearly at the window's edges."""
        times_s, powers_w = self.trace
        return window_stats(times_s, powers_w, t0_s, t1_s)

    def discard_before(self, t_s: float) -> None:
        """Forget samples older than ``t_s`` but keep the last one before it (for edges)."""
        with self._lock:
            first = bisect.bisect_left(self._times_s, t_s)  # first sample at or after t_s
            exact = first < len(self._times_s) and self._times_s[first] == t_s
            keep_from = first if exact else max(first - 1, 0)
            del self._times_s[:keep_from]
            del self._powers_w[:keep_from]
            del self._energies_j[:keep_from]
            del self._clocks_mhz[:keep_from]


def window_stats(
    times_s: Sequence[float], powers_w: Sequence[float], t0_s: float, t1_s: float
) -> WindowStats:
    """Power over ``[t0_s, t1_s]`` of a sampled trace, interpolating linearly at the edges."""
    if not times_s or t1_s <= t0_s:
        return WindowStats(0.0, 0.0, ())
    lo = bisect.bisect_right(times_s, t0_s)
    hi = bisect.bisect_left(times_s, t1_s)
    ts = [t0_s, *times_s[lo:hi], t1_s]
    ps = [
        _interpolate(times_s, powers_w, t0_s),
        *powers_w[lo:hi],
        _interpolate(times_s, powers_w, t1_s),
    ]
    a = bisect.bisect_left(times_s, t0_s)
    b = bisect.bisect_right(times_s, t1_s)
    return WindowStats(integrate_energy_j(ts, ps), max(ps), tuple(powers_w[a:b]))


def _interpolate(times_s: Sequence[float], powers_w: Sequence[float], t_s: float) -> float:
    """Power at ``t_s`` on the piecewise-linear trace (held constant outside it)."""
    if t_s <= times_s[0]:
        return powers_w[0]
    if t_s >= times_s[-1]:
        return powers_w[-1]
    i = bisect.bisect_left(times_s, t_s)  # times_s[i - 1] < t_s <= times_s[i]
    t_a, t_b = times_s[i - 1], times_s[i]
    p_a, p_b = powers_w[i - 1], powers_w[i]
    if t_b == t_a:
        return p_b
    return p_a + (p_b - p_a) * (t_s - t_a) / (t_b - t_a)


@dataclass
class PowerMeasurement(Measurement):
    """A Measurement from a real power sensor, with the cap guard's figures.

    ``energy_j`` comes from the device's own energy counter where it has one and it moved
    often enough inside the window to be placed in time (``energy_source`` "counter", see
    ``counter_energy_j``), else it is ``sampled_energy_j``, the integral of the sampled power
    (``energy_source`` "sampled"). ``clock_mhz`` is the median of the GPU clock sampled in
    the window (NaN: not read), ``clock_moved`` whether it moved by more than one step of
    the clock table. ``window_start_s`` / ``window_end_s``: the window on the device clock;
    ``power_times_s``: when each of ``power_samples_w`` was read. ``read_errors`` counts
    failed sensor reads in the window
    (``read_error``: the first one's message), ``stuck_s`` the longest stretch over which the
    power reading did not change at all.
    """

    sampled_energy_j: float = 0.0
    counter_energy_j: float | None = None
    power_rail: str = ""
    energy_source: str = "sampled"
    clock_mhz: float = math.nan
    clock_min_mhz: float = math.nan
    clock_max_mhz: float = math.nan
    clock_moved: bool = False
    read_errors: int = 0
    read_error: str = ""
    stuck_s: float = 0.0
    window_start_s: float = math.nan
    window_end_s: float = math.nan
    power_times_s: list[float] = field(default_factory=list)


def cuda_synchronize() -> None:
    """Wait for queued CUDA work, so wall time covers the step (no-op without CUDA in use)."""
    torch = sys.modules.get("torch")  # never import torch here: only sync if the step used it
    if torch is None:
        return
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        cuda.synchronize()


#: A counter is placed in time only from this many observed updates inside a window.
MIN_COUNTER_UPDATES = 3


def counter_energy_j(series: SampleSeries, t0_s: float, t1_s: float) -> float | None:
    """Energy over ``[t0_s, t1_s]`` from an energy counter read with each sample.

    A counter such as NVML's changes in steps (every ~100 ms on an H100): read at the
    window's two ends it is off by up to one step at each. So its updates are placed in
    time: an update lies between the sample before and the sample that first shows it;
    updates come at a regular period, so a straight line through their mid-points (update
    number → time) places each one, within those bounds. The counter at the window's ends
    is interpolated between the placed updates around each end (extrapolated over less
    than one update, at the counter's own rate, where the window begins or ends the
    reads). None when fewer than ``MIN_COUNTER_UPDATES`` updates fall in the window (the
    caller uses sampled power).
    """
    t = np.asarray(series.times_s, dtype=np.float64)
    e = np.asarray(series.energies_j, dtype=np.float64)
    ok = np.isfinite(e)
    if ok.sum() < 2:
        return None
    t_ok, e_ok = t[ok], e[ok]
    changed = np.flatnonzero(np.diff(e_ok) != 0) + 1
    if len(changed) < MIN_COUNTER_UPDATES:
        return None
    lows, highs, values = t_ok[changed - 1], t_ok[changed], e_ok[changed]
    mids = 0.5 * (lows + highs)
    period_s = float(mids[-1] - mids[0]) / (len(mids) - 1)
    if not period_s > 0:
        return None
    if float(np.max(np.diff(t_ok))) < period_s:
        # Every gap between reads is shorter than the period: each update was seen on its
        # own, so the n-th change is the n-th update. A line places them all.
        k = np.arange(len(mids), dtype=np.float64)
        period_s, offset = np.polyfit(k, mids, 1)
        placed = np.clip(offset + period_s * k, lows, highs)
        spacing = np.full(len(mids) - 1, period_s)
    else:  # reads too far apart to number the updates: each one mid-way
        placed = mids
        spacing = np.maximum(np.diff(mids), 1e-9)
    inside = np.flatnonzero((placed >= t0_s) & (placed <= t1_s))
    if len(inside) < MIN_COUNTER_UPDATES:
        return None
    a, b = int(inside[0]), int(inside[-1])
    if a > 0:  # an update before the window: interpolate
        a -= 1
    if b < len(placed) - 1:  # ... and after it
        b += 1
    ua, ub = float(placed[a]), float(placed[b])
    slope_a = (values[a + 1] - values[a]) / spacing[a]  # the counter's rate (W) there
    slope_b = (values[b] - values[b - 1]) / spacing[b - 1]
    e0 = values[a] + slope_a * (t0_s - ua)  # back from the first update after t0, or on
    e1 = values[b] + slope_b * (t1_s - ub)  # from the one before
    return float(e1 - e0)


def longest_unchanged_s(times_s: Sequence[float], powers_w: Sequence[float]) -> float:
    """The longest stretch of time over which consecutive readings were all equal."""
    longest, start = 0.0, 0
    for i in range(1, len(powers_w)):
        if powers_w[i] != powers_w[start]:
            start = i
        longest = max(longest, times_s[i] - times_s[start])
    return longest


class SampledMeter:
    """Wall-clock Meter over one window: the steps run back to back, the sampler samples.

    The window opens when the meter is made (``begin``: a synchronize, then the clock) and
    closes in ``finish`` (a synchronize, the clock, then the sampler's last sample): time,
    sampled power and the energy counter all cover exactly that window. A step only runs
    ``fn`` and reads the clock: no synchronize and no sensor read on the training path, so
    the measured loop is the training loop (its own synchronisation, e.g. ``train_step``'s,
    is all there is). Until ``finish``, ``measurement`` is a running view (time up to the
    end of the last step, the samples so far, sampled energy).
    """

    def __init__(
        self,
        sampler: PowerSampler,
        *,
        power_rail: str,
        guard: CapGuard | None = None,
        synchronize: Callable[[], None] = cuda_synchronize,
    ) -> None:
        self._sampler = sampler
        self._guard = guard
        self._sync = synchronize
        self._clock_step_mhz = sampler.readers.clock_step_mhz
        self._rail = power_rail
        self._steps = 0
        self._samples = 0
        self._errors_before = sampler.read_errors
        self._final: PowerMeasurement | None = None
        self._sync()
        self._t0_s = sampler.now_s()
        self._last_s = self._t0_s

    def step(self, batch_size: int, fn: Callable[[], object]) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size: must be > 0, got {batch_size}")
        if self._final is not None:
            raise RuntimeError("this meter's window is closed")
        fn()
        self._last_s = self._sampler.now_s()
        self._steps += 1
        self._samples += batch_size

    def finish(self) -> PowerMeasurement:
        """Close the window (idempotent): synchronize, stamp, last sample, the figures."""
        if self._final is None:
            try:
                self._sync()
            finally:
                t1_s = self._sampler.now_s()
                self._sampler.stop()
                self._final = self._figures(t1_s, final=True)
        return self._final

    def _figures(self, t1_s: float, *, final: bool) -> PowerMeasurement:
        t0_s = self._t0_s
        series = self._sampler.series
        times_s, powers_w = series.times_s, series.powers_w
        m = PowerMeasurement(power_rail=self._rail, steps=self._steps, samples=self._samples)
        m.time_s = max(t1_s - t0_s, 0.0)
        m.window_start_s, m.window_end_s = t0_s, t1_s
        m.read_errors = self._sampler.read_errors - self._errors_before
        m.read_error = self._sampler.first_error if m.read_errors else ""
        if not times_s:
            return with_guard_figures(m, self._guard)
        window = window_stats(times_s, powers_w, t0_s, t1_s)
        m.sampled_energy_j = window.energy_j
        a = bisect.bisect_left(times_s, t0_s)
        b = bisect.bisect_right(times_s, t1_s)
        m.power_samples_w = list(powers_w[a:b])
        m.power_times_s = list(times_s[a:b])
        # The reading the sensor held at t0 (the last one before), those inside, and on
        # closing the first one after t1, which the sensor may have shown before t1.
        held = [powers_w[max(a - 1, 0)], *m.power_samples_w]
        if final and b < len(powers_w):
            held.append(powers_w[b])
        m.peak_power_w = max(held)
        lo = max(a - 1, 0)
        m.stuck_s = longest_unchanged_s(times_s[lo:b], powers_w[lo:b])
        counter = counter_energy_j(series, t0_s, t1_s) if final else None
        m.counter_energy_j = counter
        m.energy_j = counter if counter is not None else m.sampled_energy_j
        m.energy_source = "counter" if counter is not None else "sampled"
        clocks = [c for c in series.clocks_mhz[max(a - 1, 0) : b] if math.isfinite(c)]
        if clocks:
            m.clock_mhz = float(np.median(clocks))
            m.clock_min_mhz, m.clock_max_mhz = min(clocks), max(clocks)
            m.clock_moved = m.clock_max_mhz - m.clock_min_mhz > max(self._clock_step_mhz, 1.0)
        return with_guard_figures(m, self._guard)

    @property
    def measurement(self) -> PowerMeasurement:
        if self._final is not None:
            return self._final
        return self._figures(self._last_s, final=False)

    @property
    def time_s(self) -> float:
        if self._final is not None:
            return self._final.time_s
        return max(self._last_s - self._t0_s, 0.0)

    def power_samples_since(self, index: int) -> list[float]:
        if self._final is not None:
            return self._final.power_samples_w[index:]
        return self._sampler.powers_between(self._t0_s, self._last_s, index)


@contextmanager
def sampled_measurement(
    readers: SensorReaders,
    *,
    power_rail: str,
    rate_hz: float = DEFAULT_SAMPLE_RATE_HZ,
    clock: Clock = time.monotonic,
    guard: CapGuard | None = None,
    synchronize: Callable[[], None] = cuda_synchronize,
) -> Iterator[SampledMeter]:
    """A running sampler of ``readers`` and the Meter of one window on top of it
    (``SampledMeter``); the window closes and the thread stops on the way out."""
    on_sample = guard.update if guard is not None else None
    sampler = PowerSampler(readers, rate_hz=rate_hz, clock=clock, on_sample=on_sample)
    sampler.start()
    try:
        meter = SampledMeter(sampler, power_rail=power_rail, guard=guard, synchronize=synchronize)
    except BaseException:
        sampler.stop()
        raise
    try:
        yield meter
    finally:
        meter.finish()


_D = TypeVar("_D", bound="SampledDevice")


class SampledDevice(CapGuarded):
    """What the hardware backends (jetson, nvml) share: wall clock, sampled meter, cap guard.

    Subclasses set ``_info`` and ``_record``, call ``_init_sampling``, and implement
    ``read_power_w``, ``read_clock_mhz``, ``restore``, ``step_down_knob_value`` and (if they
    hold resources) ``_release``.
    """

    sample_rate_hz: float = DEFAULT_SAMPLE_RATE_HZ
    _record: GpuStateRecord  # the GPU settings found at open, saved while they are changed

    def _init_sampling(self, options: SampledOptions) -> None:
        """Set the sampling rate (validated) and the cap guard's window; a lock for the
        GPU settings (the cap guard changes them from the sampler thread)."""
        self.sample_rate_hz = validate_rate_hz(options.sample_rate_hz)
        self.cap_window_s = options.cap_window_s
        self._lock = threading.RLock()

    @property
    def state_file(self) -> Path:
        return self._record.path

    def now_s(self) -> float:
        return time.monotonic()

    def read_power_w(self) -> float:
        raise NotImplementedError

    def energy_counter_j(self) -> Callable[[], float] | None:
        """The device's own energy counter in J, if it has one (else power is integrated)."""
        return None

    def read_clock_mhz(self) -> float:
        """The GPU clock now, in MHz (what the power sampler reads beside power)."""
        raise NotImplementedError

    def current_knob_value(self) -> float:
        """The knob's value now: with the GPU frequency as the knob, the clock."""
        return self.read_clock_mhz()

    @property
    def clock_step_mhz(self) -> float:
        """The smallest step of the device's clock table (0: unknown): a cell whose sampled
        clock moves by more is flagged (``PowerMeasurement.clock_moved``)."""
        freqs = sorted(set(self.clock_table_mhz))
        steps = [b - a for a, b in itertools.pairwise(freqs)]
        return min(steps, default=0.0)

    @property
    def clock_table_mhz(self) -> tuple[float, ...]:
        """Every clock the GPU may run at (the locked-frequency table by default)."""
        return self.knob_values

    @property
    def clocks_locked(self) -> bool:
        """Whether profiling locks the clock of each column (False: measure-only)."""
        return True

    def restore(self) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """Free what the backend holds (library handles, reader threads)."""

    @contextmanager
    def measure(self, workload: Workload) -> Iterator[SampledMeter]:
        """Time and power of the steps run through the meter (wall clock, sampled power)."""
        readers = SensorReaders(
            self.read_power_w,
            read_energy_j=self.energy_counter_j(),
            read_clock_mhz=self.read_clock_mhz,
            clock_step_mhz=self.clock_step_mhz,
        )
        with sampled_measurement(
            readers,
            power_rail=self._info.power_rail,
            rate_hz=self.sample_rate_hz,
            clock=self.now_s,
            guard=self._new_guard(),
        ) as meter:
            yield meter

    def close(self) -> None:
        try:
            self.restore()
        finally:
            self._release()

    def __enter__(self: _D) -> _D:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
