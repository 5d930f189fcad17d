"""fl_client.cell_measure: one cell measured on its own as profiling measures it, its window
sized by the device's sensor (samples, settling, hard caps, the real board's window), the
warm-up and the time's standard error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from fl_client.cell_measure import (
    CellOptions,
    CellWindow,
    measure_cell,
    measure_cell_with_sigma,
    step_time_rse,
    time_sums_rse,
    warmup_stable,
)
from fl_client.devices.base import (
    EXACT_SENSOR,
    DeviceInfo,
    Measurement,
    SensorSpec,
    Workload,
)
from fl_client.lut import LUT
from fl_client.profiler import (
    ProfileOptions,
    profile,
)
from tests.fl_client.test_profiler import (
    REAL_SENSOR,
    SWITCH_S,
    WORKLOAD,
    AccountingMeter,
    CountingSteps,
    FakeDevice,
)

# --------------------------------------------------------------------------- single cells


def test_measure_cell_measures_as_profile_does_and_restores() -> None:
    device, steps = FakeDevice(), CountingSteps()
    m, time_s, energy_j = measure_cell(
        device, WORKLOAD, 32, steps(32), 460.8, CellOptions(warmup_steps=1, steps=3)
    )
    assert m.steps == 3 and m.samples == 3 * 32  # the warm-up is not in the measurement
    assert m.time_s / m.samples == pytest.approx(device.time_per_sample_s(32, 460.8))
    assert m.peak_power_w == pytest.approx(device.power_w(32, 460.8))
    assert steps.calls[32] == 1 + 3
    # the check's cost includes the warm-up (cold, 10× slower) and the frequency change
    assert time_s == pytest.approx(SWITCH_S + 32 * device.time_per_sample_s(32, 460.8) * 13)
    assert energy_j > m.energy_j
    assert device.freq == device.initial_freq and device.restores == 1


# --------------------------------------------------------------------------- cell windows


class TraceMeter(AccountingMeter):
    """Steps from ``TraceDevice``'s script: step k takes ``time_of(k)`` and reads
    ``power_of(k)`` (None: the sensor gave no sample in that step)."""

    def __init__(self, device: TraceDevice) -> None:
        self._device = device
        self._m = Measurement()

    def step(self, batch_size: int, fn: Callable[[], object]) -> None:
        fn()
        d = self._device
        k = d.steps_run
        d.steps_run += 1
        dt, power_w = d.time_of(k), d.power_of(k)
        d.clock_s += dt
        m = self._m
        m.time_s += dt
        m.energy_j += (power_w if power_w is not None else d.last_power_w) * dt
        if power_w is not None:
            d.last_power_w = power_w
            m.power_samples_w.append(power_w)
            m.peak_power_w = max(m.peak_power_w, power_w)
        m.steps += 1
        m.samples += batch_size


class TraceDevice:
    """One frequency, steps from a script, and a power sensor (``DeviceInfo.sensor``)."""

    def __init__(
        self,
        time_of: Callable[[int], float],
        power_of: Callable[[int], float | None] = lambda k: 5.0,
        sensor: SensorSpec = EXACT_SENSOR,
        board: SensorSpec | None = None,
    ) -> None:
        self.time_of, self.power_of = time_of, power_of
        self.sensor, self.board = sensor, board
        self.steps_run = 0
        self.clock_s = 0.0
        self.last_power_w = 0.0

    @property
    def info(self) -> DeviceInfo:
        return DeviceInfo(
            "trace", "fake", (100.0,), 1 << 30, "rail", sensor=self.sensor, board_sensor=self.board
        )

    @property
    def knob_values(self) -> tuple[float, ...]:
        return (100.0,)

    def current_knob_value(self) -> float:
        return 100.0

    def set_knob_value(self, knob_value: float) -> None:
        assert knob_value == 100.0

    def restore(self) -> None:
        pass

    def now_s(self) -> float:
        return self.clock_s

    @contextmanager
    def measure(self, workload: Workload) -> Iterator[TraceMeter]:
        yield TraceMeter(self)

    def close(self) -> None:
        pass


def _cell(device: TraceDevice, **kw: Any) -> Any:
    return measure_cell_with_sigma(
        device, WORKLOAD, 4, lambda: None, 100.0, CellOptions(warmup_steps=0, **kw)
    )


def test_a_slow_sensor_makes_the_cell_measure_until_its_window_and_samples() -> None:
    # 0.1 s steps; the sensor wants 1 s and 5 samples
    sensor = SensorSpec("slow", min_window_s=1.0, min_power_samples=5)
    fast = _cell(TraceDevice(lambda k: 0.1, sensor=sensor))
    assert fast.measurement.steps == 10 and fast.window_s == pytest.approx(1.0)  # the window
    assert fast.power_samples == 10 and fast.settled
    # ... a sensor with one reading every 4th step: 5 samples take 20 steps
    slow = TraceDevice(lambda k: 0.1, lambda k: 5.0 if k % 4 == 3 else None, sensor=sensor)
    cell = _cell(slow)
    assert cell.measurement.steps == 20 and cell.power_samples == 5 and cell.settled
    assert cell.window_s == pytest.approx(2.0) and cell.time_s == pytest.approx(2.0)
    # the fixed count is only the lower bound; ``fixed`` measures exactly it
    assert _cell(TraceDevice(lambda k: 0.1, sensor=sensor), steps=30).measurement.steps == 30
    fixed = _cell(TraceDevice(lambda k: 0.1, sensor=sensor), window=CellWindow.fixed(3))
    assert fixed.measurement.steps == 3
    # the profiler records the samples, the window and that the cell settled
    lut = profile(
        slow, WORKLOAD, [4], CountingSteps(), ProfileOptions(warmup_steps=0, progress=False)
    )
    assert lut.power_samples[0, 0] == 5 and lut.window_s[0, 0] == pytest.approx(2.0)
    assert lut.settled[0, 0] == 1 and np.isnan(lut.needed_window_s).all()  # no board
    # a window and sample minimum given in the options replace the sensor's
    short = profile(
        TraceDevice(lambda k: 0.1, sensor=sensor),
        WORKLOAD,
        [4],
        CountingSteps(),
        ProfileOptions(warmup_steps=0, progress=False, min_window_s=0.5),
    )
    assert short.window_s[0, 0] == pytest.approx(0.5) and short.power_samples[0, 0] == 5


def test_a_noisy_then_settled_trace_stops_at_settle() -> None:
    # a transient (caches filling, clocks and power ramping), with noise, then steady
    noisy = (0.3, 0.2, 0.16, 0.13, 0.115, 0.105)  # then 0.1 s per step
    peaks = (8.0, 6.5, 6.0, 5.5, 5.2, 5.1)  # then 5 W

    def trace() -> TraceDevice:
        return TraceDevice(
            lambda k: noisy[k] if k < len(noisy) else 0.1,
            lambda k: peaks[k] if k < len(peaks) else 5.0,
        )

    cell = _cell(trace())
    n = cell.measurement.steps
    assert cell.settled and len(noisy) < n < 100  # past the noise, long before the cap
    # settled: over the last quarter of the steps the running means moved by ≤ 2%
    k = math.ceil(n / 4)
    times = [noisy[i] if i < len(noisy) else 0.1 for i in range(n)]
    assert abs(sum(times) / n - sum(times[: n - k]) / (n - k)) <= 0.02 * sum(times) / n
    # one step fewer had not settled: it stopped at the first step that did
    m = n - 1
    k = math.ceil(m / 4)
    t_prev = [noisy[i] if i < len(noisy) else 0.1 for i in range(m)]
    p_prev = [peaks[i] if i < len(peaks) else 5.0 for i in range(m)]
    moved = [abs(sum(v) / m - sum(v[: m - k]) / (m - k)) / (sum(v) / m) for v in (t_prev, p_prev)]
    assert max(moved) > 0.02
    # a steady trace stops at the fixed count; a looser tolerance stops sooner
    assert _cell(TraceDevice(lambda k: 0.1)).measurement.steps == 3
    assert _cell(trace(), window=CellWindow(3, settle_tolerance=0.1)).measurement.steps < n


def test_the_hard_cap_marks_a_cell_unsettled() -> None:
    def ramp() -> TraceDevice:  # every step 5% slower (a thermal ramp): never settles
        return TraceDevice(lambda k: 0.01 * 1.05**k)

    capped = _cell(ramp(), window=CellWindow(3, max_steps=50))
    assert capped.measurement.steps == 50 and not capped.settled
    by_time = _cell(ramp(), window=CellWindow(3, max_window_s=1.0))
    assert (
        not by_time.settled
        and 1.0 <= by_time.window_s < 1.0 + 0.01 * 1.05**by_time.measurement.steps
    )
    lut = profile(
        ramp(),
        WORKLOAD,
        [4],
        CountingSteps(),
        ProfileOptions(warmup_steps=0, progress=False, max_steps=40),
    )
    assert (
        lut.settled[0, 0] == 0
        and int((lut.settled == 0).sum()) == 1
        and lut.power_samples[0, 0] == 40
    )
    back = LUT.from_json(lut.to_json())
    assert back.settled[0, 0] == 0 and int((back.settled == 0).sum()) == 1
    # the caps are bounds: never below the fixed count
    with pytest.raises(ValueError, match="max-steps: must be ≥ steps"):
        CellWindow(10, max_steps=5)
    assert ProfileOptions(steps=10, max_steps=5).cell_window(ramp()).max_steps == 10
    for bad, message in (
        ({"settle_tolerance": 0.0}, "settle-tolerance"),
        ({"min_window_s": -1.0}, "min-window-s"),
        ({"min_window_s": math.inf}, "min-window-s"),
        ({"min_power_samples": 1.5}, "min-power-samples"),
        ({"max_window_s": -1.0}, "max-window-s"),
        ({"sizing": "adaptive"}, "sizing: unknown value"),
    ):
        with pytest.raises(ValueError, match=message):
            ProfileOptions(**bad)


def test_an_emulated_device_reports_the_window_its_real_board_needs() -> None:
    board = SensorSpec("board", min_window_s=0.5, min_power_samples=10)
    dev = TraceDevice(lambda k: 0.02, board=board)
    cell = _cell(dev)
    assert cell.measurement.steps == 3 and cell.window_s == pytest.approx(0.06)
    assert cell.needed_window_s == pytest.approx(0.5)  # 25 steps of 20 ms
    lut = profile(
        TraceDevice(lambda k: 0.02, board=board),
        WORKLOAD,
        [4],
        CountingSteps(),
        ProfileOptions(warmup_steps=0, progress=False),
    )
    assert lut.needed_window_s[0, 0] == pytest.approx(0.5)
    # reported, not charged: profiling time is the emulated clock's
    assert lut.profile_time_s == pytest.approx(0.06)
    assert lut.board_profile_time_s == pytest.approx(0.5)
    # a step longer than the window: the measured steps are what the board needs
    assert _cell(TraceDevice(lambda k: 0.4, board=board)).needed_window_s == pytest.approx(1.2)


def test_step_time_rse_by_batch_means() -> None:
    assert step_time_rse([0.01] * 9) == pytest.approx(0.0, abs=1e-12)  # equal steps
    assert step_time_rse([0.01]) == math.inf  # one batch: nothing to judge
    rng = np.random.default_rng(1)
    # independent steps (20% noise): on average σ/√n, as the plain formula says
    rses = [
        step_time_rse((0.01 * (1 + 0.2 * rng.standard_normal(400))).tolist()) for _ in range(50)
    ]
    assert float(np.mean(rses)) == pytest.approx(0.2 / math.sqrt(400), rel=0.1)
    # blocks of 10 equal steps (as a queue that drains every 10 steps): the batches see
    # the blocks, so the error is larger than 10 independent steps' would suggest
    blocky = np.repeat(0.01 * (1 + 0.2 * rng.standard_normal(40)), 10).tolist()
    assert step_time_rse(blocky) > 2 * 0.2 / math.sqrt(400)


def test_warmup_runs_until_the_step_time_is_stable() -> None:
    assert not warmup_stable([1.0, 0.01, 0.01, 0.01, 0.01, 0.01])
    assert warmup_stable([1.0, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01])
    assert not warmup_stable([0.01] * 5)  # two full blocks needed


def test_a_real_sensor_warms_up_until_the_step_time_is_stable() -> None:
    # a device with a real sensor (readings every 0.1 s): 5 slow first steps, then 0.1 s
    slow_start = TraceDevice(lambda k: 1.0 if k < 5 else 0.1, sensor=REAL_SENSOR)
    cell = measure_cell_with_sigma(
        slow_start,
        WORKLOAD,
        4,
        lambda: None,
        100.0,
        CellOptions(warmup_steps=1, window=CellWindow(3)),
    )
    assert cell.measurement.time_s / cell.measurement.steps == pytest.approx(0.1)
    # an emulated clock (twin, replay table) models no warm-up: its asked-for steps only
    emulated = TraceDevice(lambda k: 1.0 if k < 5 else 0.1)
    cell = measure_cell_with_sigma(
        emulated,
        WORKLOAD,
        4,
        lambda: None,
        100.0,
        CellOptions(warmup_steps=1, window=CellWindow(3)),
    )
    assert cell.measurement.time_s / cell.measurement.steps > 0.1


def test_the_cell_loop_reads_only_the_cheap_views_after_each_step() -> None:
    built: list[int] = []

    class Counting(AccountingMeter):
        def __init__(self, inner: AccountingMeter) -> None:
            self._inner = inner
            self._m = inner._m

        def step(self, batch_size: int, fn: Callable[[], object]) -> None:
            self._inner.step(batch_size, fn)  # type: ignore[attr-defined]

        @property
        def measurement(self) -> Measurement:
            built.append(self._m.steps)
            return self._m

    class Device(TraceDevice):
        @contextmanager
        def measure(self, workload: Workload) -> Iterator[Counting]:  # type: ignore[override]
            with super().measure(workload) as meter:
                yield Counting(meter)

    # 0.01 s steps with 10% noise, a 1 s window: hundreds of steps
    rng = np.random.default_rng(3)
    noise = 0.01 * (1 + 0.1 * rng.standard_normal(5000))
    window = CellWindow(3, min_window_s=1.0)
    cell = measure_cell_with_sigma(
        Device(lambda k: float(noise[k])),
        WORKLOAD,
        4,
        lambda: None,
        100.0,
        CellOptions(warmup_steps=5, window=window),
    )
    assert cell.measurement.steps >= 100 and cell.settled
    assert len(built) <= 4  # once per measured stretch (warm-up, cell), never per step


def test_the_time_error_from_running_sums_is_the_batch_means_error() -> None:
    """``time_sums_rse`` (judged after every step from ⌊√n⌋ + 1 running sums) is the
    batch-means error computed from the step times themselves."""
    rng = np.random.default_rng(5)
    for n in (2, 3, 4, 9, 10, 17, 100, 101, 999, 5000):
        steps = 0.01 * (1 + 0.3 * rng.standard_normal(n))
        size = max(1, math.isqrt(n))
        k = n // size
        if k < 2:
            assert time_sums_rse(np.cumsum(steps).tolist()) == math.inf
            continue
        means = steps[n - k * size :].reshape(k, size).mean(axis=1)
        direct = float(np.std(means, ddof=1)) / math.sqrt(k) / float(means.mean())
        assert time_sums_rse(np.cumsum(steps).tolist()) == pytest.approx(direct, rel=1e-9)
        assert step_time_rse(steps.tolist()) == pytest.approx(direct, rel=1e-9)
