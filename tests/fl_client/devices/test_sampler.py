"""The power sampler, energy integration, the cap guard and the wall-clock meter, on
synthetic traces with an injected clock (deterministic)."""

from __future__ import annotations

import math
import sys
import threading
import time
import types

import pytest

from fl_client.devices.guard import CapGuard
from fl_client.devices.sampler import (
    PowerSampler,
    SampledMeter,
    SensorReaders,
    cuda_synchronize,
    integrate_energy_j,
    sampled_measurement,
)


class FakeClock:
    """Advances by ``tick_s`` on every call; ``now`` is the last time handed out."""

    def __init__(self, tick_s: float = 0.1, start_s: float = 100.0) -> None:
        self.tick_s = tick_s
        self.now = start_s - tick_s
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += self.tick_s
            return self.now

    def advance(self, dt_s: float) -> None:
        with self._lock:
            self.now += dt_s


def test_trapezoidal_energy_of_a_known_trace():
    # 0-1 s ramp 2→4 W (3 J), 1-2 s flat 4 W (4 J), 2-4 s ramp 4→0 W (4 J)
    assert integrate_energy_j([0, 1, 2, 4], [2, 4, 4, 0]) == pytest.approx(11.0)
    assert integrate_energy_j([5.0], [3.0]) == 0.0
    assert integrate_energy_j([], []) == 0.0
    with pytest.raises(ValueError, match="time stamps"):
        integrate_energy_j([0, 1], [1.0])


def test_sampler_on_a_synthetic_trace():
    clock = FakeClock(tick_s=0.5, start_s=0.0)
    trace = iter([4.0, 6.0, 8.0, 6.0, 4.0])
    sampler = PowerSampler(SensorReaders(lambda: next(trace)), clock=clock)
    for _ in range(5):
        sampler.sample()
    times, powers = sampler.trace
    assert times == (0.0, 0.5, 1.0, 1.5, 2.0)
    assert powers == (4.0, 6.0, 8.0, 6.0, 4.0)
    assert sampler.energy_j == pytest.approx(0.5 * (5 + 7 + 7 + 5))
    assert sampler.peak_power_w == 8.0
    assert sampler.duration_s == 2.0
    assert sampler.avg_power_w == pytest.approx(12.0 / 2.0)


def test_sampler_thread_integrates_a_ramp_exactly():
    # P(t) = 5 + 2 (t - t0): trapezoids are exact on a linear trace, whatever the sample times.
    clock = FakeClock(tick_s=0.01, start_s=0.0)
    sampler = PowerSampler(SensorReaders(lambda: 5.0 + 2.0 * clock.now), rate_hz=500.0, clock=clock)
    with sampler:
        assert sampler.running
        deadline = threading.Event()
        deadline.wait(0.1)
    assert not sampler.running
    times = sampler.trace[0]
    assert len(times) >= 5  # start, thread samples, stop
    assert times == tuple(sorted(times))
    t0, t1 = times[0], times[-1]
    exact = 5.0 * (t1 - t0) + (t1**2 - t0**2)
    assert sampler.energy_j == pytest.approx(exact, rel=1e-9)
    assert sampler.peak_power_w == pytest.approx(5.0 + 2.0 * t1)


def test_sampler_thread_rate_is_at_least_ten_hertz_by_default():
    sampler = PowerSampler(SensorReaders(lambda: 1.0))
    assert sampler.rate_hz >= 10.0
    with sampler:
        threading.Event().wait(0.35)
    assert len(sampler.trace[0]) >= 5  # ≈ 0.35 s × 20 Hz + 2


def test_window_interpolates_edges():
    clock = FakeClock(tick_s=2.0, start_s=0.0)
    trace = iter([0.0, 4.0])
    sampler = PowerSampler(SensorReaders(lambda: next(trace)), clock=clock)
    sampler.sample()
    sampler.sample()  # (0 s, 0 W), (2 s, 4 W): P = 2 t
    w = sampler.window(0.5, 1.5)
    assert w.energy_j == pytest.approx(2.0)  # ∫ 2t dt from 0.5 to 1.5
    assert w.peak_power_w == pytest.approx(3.0)
    assert w.powers_w == ()
    assert sampler.window(1.0, 1.0).energy_j == 0.0
    sampler.discard_before(1.0)
    assert sampler.trace[0] == (0.0, 2.0)  # the sample before 1.0 stays for interpolation
    sampler.discard_before(2.0)
    assert sampler.trace[0] == (2.0,)


def test_sensor_errors_are_skipped_not_fatal():
    calls = {"n": 0}

    def flaky() -> float:
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            raise OSError("i2c timeout")
        return 3.0

    sampler = PowerSampler(SensorReaders(flaky), clock=FakeClock())
    assert sampler.try_sample() is not None
    assert sampler.try_sample() is None
    assert sampler.read_errors == 1


@pytest.mark.parametrize("rate", [0, -1, math.nan, math.inf])
def test_bad_rate_names_the_key(rate: float):
    with pytest.raises(ValueError, match="sample-rate-hz"):
        PowerSampler(SensorReaders(lambda: 1.0), rate_hz=rate)


def test_a_failing_step_down_does_not_end_the_sampler_thread():
    def refuse() -> None:
        raise RuntimeError("no permission")

    guard = CapGuard(5.0, window_s=0.0, on_violation=refuse)
    sampler = PowerSampler(SensorReaders(lambda: 9.0), rate_hz=200.0, on_sample=guard.update)
    sampler.start()
    time.sleep(0.2)
    alive = sampler._thread is not None and sampler._thread.is_alive()
    sampler.stop()
    assert alive
    assert guard.cap_violations >= 2 and guard.time_over_cap_s > 0


def test_meter_integrates_one_window_over_the_steps():
    clock = FakeClock(tick_s=0.0, start_s=10.0)
    power = {"w": 4.0}
    sampler = PowerSampler(SensorReaders(lambda: power["w"]), clock=clock)
    sampler.sample()
    synced: list[float] = []
    meter = SampledMeter(sampler, power_rail="VDD_IN", synchronize=lambda: synced.append(1))
    assert synced == [1]  # the window opens after a synchronize

    def work() -> None:  # 2 s of work while power ramps to 8 W, sampled mid-way
        clock.advance(1.0)
        power["w"] = 6.0
        sampler.sample()
        clock.advance(1.0)
        power["w"] = 8.0
        sampler.sample()

    meter.step(32, work)
    clock.advance(0.5)  # time between steps is the loop's: it is in the window
    power["w"] = 2.0
    sampler.sample()
    meter.step(32, lambda: clock.advance(0.5))
    assert synced == [1]  # no synchronize per step
    running = meter.measurement
    assert running.time_s == pytest.approx(3.0) and running.steps == 2
    m = meter.finish()
    assert synced == [1, 1]
    assert m.steps == 2 and m.samples == 64
    assert m.time_s == pytest.approx(3.0)
    # 4→6→8 W over 2 s (12 J), 8→2 W over 0.5 s (2.5 J), 2 W for 0.5 s (1 J)
    assert m.sampled_energy_j == pytest.approx(15.5)
    assert m.energy_j == m.sampled_energy_j and m.energy_source == "sampled"
    assert m.peak_power_w == 8.0
    assert m.counter_energy_j is None
    assert m.avg_power_w == pytest.approx(15.5 / 3.0)
    assert (m.window_start_s, m.window_end_s) == (10.0, 13.0)
    assert meter.finish() is m
    with pytest.raises(RuntimeError, match="closed"):
        meter.step(1, lambda: None)


def test_meter_takes_energy_from_the_counter_over_the_same_window():
    """A counter stepping every 0.1 s, read with each 0.03 s sample: its updates are placed
    in time, so the window's energy is right to a fraction of a read interval at each end
    (read only at the ends it could be off by a whole update: ±8% of 1.2 s)."""
    clock = FakeClock(tick_s=0.0, start_s=0.0)
    watts = 50.0

    def counter_j() -> float:  # latched every 0.1 s at phase 0.04
        return 1000.0 + watts * (math.floor((clock.now - 0.04) / 0.1) * 0.1 + 0.04)

    sampler = PowerSampler(SensorReaders(lambda: watts, read_energy_j=counter_j), clock=clock)
    sampler.sample()
    meter = SampledMeter(sampler, power_rail="nvml", synchronize=lambda: None)
    for _ in range(40):
        clock.advance(0.03)
        sampler.sample()
    meter.step(8, lambda: None)
    m = meter.finish()
    assert m.energy_source == "counter"
    assert m.counter_energy_j == pytest.approx(watts * 1.2, rel=0.02)
    assert m.energy_j == m.counter_energy_j
    assert m.sampled_energy_j == pytest.approx(watts * 1.2)


def test_counter_with_too_few_updates_leaves_energy_to_the_samples():
    clock = FakeClock(tick_s=0.0, start_s=0.0)
    sampler = PowerSampler(SensorReaders(lambda: 5.0, read_energy_j=lambda: 7.0), clock=clock)
    sampler.sample()
    meter = SampledMeter(sampler, power_rail="nvml", synchronize=lambda: None)
    clock.advance(2.0)
    sampler.sample()
    meter.step(8, lambda: None)
    m = meter.finish()
    assert m.energy_source == "sampled" and m.counter_energy_j is None
    assert m.energy_j == pytest.approx(10.0)
    assert m.stuck_s == pytest.approx(2.0)  # an unchanging reading is reported


def test_meter_reports_the_sampled_clock_and_whether_it_moved():
    clock = FakeClock(tick_s=0.0, start_s=0.0)
    clocks = iter([1980.0, 1980.0, 1965.0, 1410.0])
    readers = SensorReaders(
        lambda: 5.0, read_clock_mhz=lambda: next(clocks), clock_every=1, clock_step_mhz=15
    )
    sampler = PowerSampler(readers, clock=clock)
    sampler.sample()
    meter = SampledMeter(sampler, power_rail="nvml", synchronize=lambda: None)
    for _ in range(2):
        clock.advance(0.1)
        sampler.sample()
    m = meter.measurement
    assert m.clock_mhz == 1980.0 and not m.clock_moved  # 1980, 1980, 1965: one step
    clock.advance(0.1)
    sampler.sample()
    m = meter.finish()
    assert m.clock_min_mhz == 1410.0 and m.clock_moved


def test_a_failed_read_is_counted_and_named():
    def broken() -> float:
        raise RuntimeError("nvml: nvmlDeviceGetPowerUsage failed on GPU-x")

    sampler = PowerSampler(SensorReaders(broken), clock=FakeClock(tick_s=0.0))
    assert sampler.try_sample() is None
    assert sampler.read_errors == 1 and "nvmlDeviceGetPowerUsage" in sampler.first_error


def test_meter_rejects_bad_batch_size():
    meter = SampledMeter(
        PowerSampler(SensorReaders(lambda: 1.0)), power_rail="x", synchronize=lambda: None
    )
    with pytest.raises(ValueError, match="batch_size"):
        meter.step(0, lambda: None)


def test_sampled_measurement_reports_guard_figures():
    clock = FakeClock(tick_s=0.0)
    guard = CapGuard(5.0, window_s=0.5)
    with sampled_measurement(
        SensorReaders(lambda: 7.0),
        power_rail="VDD_IN",
        clock=clock,
        guard=guard,
        synchronize=lambda: None,
    ) as meter:
        meter.step(4, lambda: clock.advance(1.2))
    m = meter.measurement
    assert m.cap_violations >= 1
    assert m.time_over_cap_s == pytest.approx(1.2)


def test_cuda_synchronize_only_when_cuda_is_in_use(monkeypatch: pytest.MonkeyPatch):
    synced: list[int] = []
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        synchronize=lambda: synced.append(1),
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    cuda_synchronize()
    assert synced == [1]
    cuda.is_initialized = lambda: False
    cuda_synchronize()
    assert synced == [1]
    monkeypatch.setitem(sys.modules, "torch", None)
    cuda_synchronize()  # torch not imported: nothing to do


def test_the_meters_cheap_views_equal_the_full_figures_while_it_runs():
    """``time_s`` and ``power_samples_since`` (read after every step by the profiler) say
    what ``measurement`` says, from binary searches and a slice of the new samples only."""
    clock = FakeClock(tick_s=0.0, start_s=5.0)
    sampler = PowerSampler(SensorReaders(lambda: 10.0 + clock.now), clock=clock)
    sampler.sample()  # before the window: never one of its samples
    clock.advance(0.01)
    meter = SampledMeter(sampler, power_rail="nvml", synchronize=lambda: None)
    seen: list[float] = []
    for k in range(30):

        def work(k: int = k) -> None:
            for _ in range(k % 3):  # 0, 1 or 2 samples inside the step
                clock.advance(0.02)
                sampler.sample()
            clock.advance(0.01)

        meter.step(4, work)
        added = meter.power_samples_since(len(seen))
        seen += added
        running = meter.measurement
        assert meter.time_s == pytest.approx(running.time_s)
        assert seen == running.power_samples_w
        assert meter.power_samples_since(3) == running.power_samples_w[3:]
    assert len(seen) == 30
    clock.advance(0.01)
    sampler.sample()  # a sample after the last step
    assert meter.power_samples_since(len(seen)) == []  # ... is not the window's yet
    m = meter.finish()
    assert meter.time_s == m.time_s and meter.power_samples_since(0) == m.power_samples_w
