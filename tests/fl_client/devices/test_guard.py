"""The cap guard: on its own, on the emulated backends (digital twin, replay) and through the
factory's ``cap_guard`` helper: armed only inside the block, steps the frequency down one
level when power stays above P_max for the window, reports ``cap_violations`` and
``time_over_cap_s``."""

from __future__ import annotations

import math

import pytest

from fl_client.devices import DeviceOptions, Measurement, Workload, cap_guard, locked, open_device
from fl_client.devices.descriptors import load_device_spec
from fl_client.devices.guard import CapGuard, guard_step
from fl_client.devices.replay import ReplayDevice
from fl_client.devices.simulated import SimulatedDevice, highest_feasible_freq_mhz, power_w
from fl_client.model_zoo import train_flops_per_sample
from fl_client.settings import REPO_ROOT

EXAMPLE = REPO_ROOT / "configs" / "replay" / "example-illustrative-jetson-nano-resnet18.csv"
CNN = Workload("cnn", (3, 32, 32), train_flops_per_sample("cnn"))
RESNET = Workload("resnet18", (3, 32, 32), train_flops_per_sample("resnet18"))


def noop() -> None:
    pass


def test_every_measurement_carries_the_guard_figures():
    m = Measurement()
    assert (m.cap_violations, m.time_over_cap_s) == (0, 0.0)


def test_guard_step_holds_the_power_over_the_step():
    guard = CapGuard(5.0, window_s=0.3)
    guard_step(guard, 0.0, 0.2, 4.0)  # below
    guard_step(guard, 0.2, 0.4, 6.0)  # 0.2 s above: shorter than the window
    assert (guard.cap_violations, guard.time_over_cap_s) == (0, pytest.approx(0.2))
    guard_step(guard, 0.4, 0.6, 6.0)  # 0.4 s above in a row: one step down
    assert (guard.cap_violations, guard.time_over_cap_s) == (1, pytest.approx(0.4))
    guard_step(guard, 0.6, 0.7, 4.0)  # back below: the run of over-cap time restarts
    guard_step(guard, 0.7, 0.9, 6.0)
    assert (guard.cap_violations, guard.time_over_cap_s) == (1, pytest.approx(0.6))
    guard_step(None, 0.0, 1.0, 9.0)  # no guard armed: nothing to do


def test_twin_guard_steps_down_until_the_cap_is_met():
    spec = load_device_spec("jetson-nano")
    cap_w = 4.5
    assert power_w(spec, 128, 921.6, CNN.flops_per_sample) > cap_w  # the lock breaks the cap
    dev = SimulatedDevice(spec, noise=False)
    with locked(dev, 921.6), cap_guard(dev, cap_w, window_s=1e-4), dev.measure(CNN) as meter:
        for _ in range(30):
            meter.step(128, noop)
        final_mhz = dev.current_knob_value()
    m = meter.measurement
    expected_mhz = highest_feasible_freq_mhz(spec, 128, cap_w, CNN.flops_per_sample)
    assert expected_mhz is not None and final_mhz == expected_mhz
    levels = spec.freq_index(921.6) - spec.freq_index(expected_mhz)
    assert m.cap_violations == levels  # one level per violation
    over = [r for r in meter.records if r.peak_power_w > cap_w]
    assert len(over) == levels  # each over-cap step was followed by a step down
    assert m.time_over_cap_s == pytest.approx(sum(r.time_s for r in over))
    assert dev.current_knob_value() == spec.max_freq_mhz  # `locked` restored on the way out


def test_twin_window_is_on_the_emulated_clock():
    spec = load_device_spec("jetson-nano")
    dev = SimulatedDevice(spec, noise=False)
    dev.set_knob_value(921.6)
    with cap_guard(dev, 4.5, window_s=3600.0), dev.measure(CNN) as meter:
        for _ in range(10):
            meter.step(128, noop)
    m = meter.measurement
    assert m.cap_violations == 0 and dev.current_knob_value() == 921.6  # window not reached
    assert m.time_over_cap_s == pytest.approx(m.time_s)  # but every step was over the cap


def test_twin_unguarded_outside_the_block_and_stuck_at_the_lowest_level(
    caplog: pytest.LogCaptureFixture,
):
    spec = load_device_spec("jetson-nano")
    dev = SimulatedDevice(spec, noise=False)
    dev.set_knob_value(921.6)
    with dev.measure(CNN) as meter:  # profiling: never guarded
        meter.step(128, noop)
    assert meter.measurement.cap_violations == 0 and dev.current_knob_value() == 921.6
    dev.set_knob_value(76.8)
    with cap_guard(dev, 0.5, window_s=1e-4), dev.measure(CNN) as meter:
        for _ in range(3):
            meter.step(128, noop)
    assert meter.measurement.cap_violations == 3  # counted although f cannot go lower
    assert dev.current_knob_value() == 76.8
    assert caplog.text.count("cannot go lower") == 1  # said once


def test_no_cap_arms_nothing():
    dev = SimulatedDevice(load_device_spec("jetson-nano"), noise=False)
    dev.set_knob_value(921.6)
    with cap_guard(dev, float("inf")), dev.measure(CNN) as meter:
        meter.step(128, noop)
    assert meter.measurement.cap_violations == 0 and meter.measurement.time_over_cap_s == 0.0


def test_replay_guard_walks_down_the_table():
    dev = open_device("jetson-nano", "replay", options=DeviceOptions(replay_table=str(EXAMPLE)))
    assert isinstance(dev, ReplayDevice)
    [table] = dev.tables
    cap_w = 5.0
    with locked(dev, 921.6), cap_guard(dev, cap_w, window_s=1e-4), dev.measure(RESNET) as meter:
        for _ in range(20):
            meter.step(128, noop)
        assert dev.current_knob_value() == 307.2  # the paper's Fig. 1: b=128 up to 307.2
    m = meter.measurement
    over = [r for r in table.rows if r.batch_size == 128 and r.peak_power_w > cap_w]
    assert sorted(r.knob_value for r in over) == [f for f in dev.knob_values if f > 307.2]
    assert m.cap_violations == len(over)
    assert m.time_over_cap_s == pytest.approx(sum(r.time_per_step_s for r in over))


def test_replay_step_down_needs_a_lock():
    dev = ReplayDevice.from_file(EXAMPLE)
    assert dev.step_down_knob_value() is None  # not locked: nothing to step down
    dev.set_knob_value(76.8)
    assert dev.step_down_knob_value() is None  # lowest level
    dev.set_knob_value(153.6)
    assert dev.step_down_knob_value() == 76.8 and dev.current_knob_value() == 76.8


def test_cap_guard_counts_violations_and_time_over_cap():
    fired: list[int] = []
    guard = CapGuard(5.0, window_s=1.0, on_violation=lambda: fired.append(1))
    # 4 W → 6 W crosses 5 W at 0.25 s; 6 W → 4 W crosses back at 1.75 s
    for t, p in [(0.0, 4.0), (0.5, 6.0), (1.0, 6.0), (1.5, 6.0), (2.0, 4.0), (2.5, 4.0)]:
        guard.update(t, p)
    assert guard.time_over_cap_s == pytest.approx(1.5)
    assert guard.cap_violations == 1  # over the cap 0.25 → 1.5 s ≥ 1 s window
    assert fired == [1]


def test_cap_guard_needs_a_full_window_between_steps_down():
    guard = CapGuard(5.0, window_s=1.0)
    for i in range(31):  # 3 s at 9 W, sampled at 10 Hz
        guard.update(i * 0.1, 9.0)
    assert guard.cap_violations == 3
    assert guard.time_over_cap_s == pytest.approx(3.0)


def test_cap_guard_keeps_counting_when_it_cannot_step_down(caplog):
    def refuse() -> None:
        raise RuntimeError("clock lock refused")

    guard = CapGuard(5.0, window_s=1.0, on_violation=refuse)
    for i in range(31):  # 3 s at 9 W; every step down fails
        guard.update(i * 0.1, 9.0)
    assert guard.cap_violations == 3 and guard.step_down_errors == 3
    assert guard.time_over_cap_s == pytest.approx(3.0)
    warned = [r for r in caplog.records if "stepping the GPU down failed" in r.getMessage()]
    assert len(warned) == 1 and "clock lock refused" in warned[0].getMessage()


def test_cap_guard_short_peaks_do_not_step_down():
    guard = CapGuard(5.0, window_s=1.0)
    for i in range(40):  # 0.2 s spikes every second
        guard.update(i * 0.1, 8.0 if i % 10 in (3, 4) else 4.0)
    assert guard.cap_violations == 0
    assert guard.time_over_cap_s > 0


@pytest.mark.parametrize("p_max_w", [0.0, -1.0, math.nan, math.inf])
def test_cap_guard_needs_a_finite_cap(p_max_w: float):
    with pytest.raises(ValueError, match="p-max-w"):
        CapGuard(p_max_w)
