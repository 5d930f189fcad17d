"""The nvml backend against a fake ``pynvml``: unit conversions, locked clocks when root,
measure-only otherwise, restore, energy counter, the permission path (a refused lock and
reset), CUDA_VISIBLE_DEVICES, instantaneous power. No real GPU clock is ever touched."""

from __future__ import annotations

import json
import math
import os
import time
import types
from pathlib import Path

import pytest

from fl_client.devices import (
    DeviceError,
    DevicePermissionError,
    DeviceUnavailableError,
    InvalidFrequencyError,
    Workload,
    locked,
    safety,
)
from fl_client.devices.nvml import NvmlControl, NvmlDevice, restore_saved_settings
from fl_client.devices.sampler import PowerMeasurement, SampledOptions
from tests.fl_client.devices.conftest import FakeGpu, make_fake_pynvml
from tests.fl_client.devices.test_nvml_lib import UUIDS

WORKLOAD = Workload("resnet18", (3, 32, 32), 1e9)


def lock_calls(gpu: FakeGpu) -> list[tuple[str, object]]:
    return [c for c in gpu.calls if "Locked" in c[0]]


def test_reads_descriptor_and_converts_units(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None
):
    dev = NvmlDevice()
    assert dev.info.backend == "nvml"
    assert dev.info.kind == "nvidia-h100-80gb-hbm3"
    assert dev.info.memory_bytes == 85_520_809_984
    assert dev.info.power_rail == "nvml:gpu-board"
    assert dev.read_power_w() == pytest.approx(123.456)  # mW → W
    fake_gpu.energy_mj = 9_999_750
    assert dev.read_energy_j() == pytest.approx(10_000.0)  # mJ → J
    assert dev.current_knob_value() == 1755.0
    dev.close()


def test_root_locks_supported_clocks_and_restores(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None, state_dir: Path
):
    dev = NvmlDevice("h100")
    assert not dev.measure_only
    assert dev.knob_values == (345.0, 1005.0, 1410.0, 1965.0, 1980.0)  # ascending
    with locked(dev, 1410.0):
        assert fake_gpu.locked == (1410, 1410)
        assert dev.current_knob_value() == 1410.0
        saved = json.loads(next(state_dir.glob("nvml-*.json")).read_text())
        assert saved["settings"]["uuid"] == fake_gpu.uuid
    assert fake_gpu.locked is None
    assert lock_calls(fake_gpu)[-1] == ("nvmlDeviceResetGpuLockedClocks", ())
    assert not list(state_dir.glob("nvml-*.json"))
    dev.restore()  # idempotent: no second reset
    assert sum(c[0] == "nvmlDeviceResetGpuLockedClocks" for c in fake_gpu.calls) == 1
    with pytest.raises(InvalidFrequencyError, match="allowed: 345, 1005"):
        dev.set_knob_value(1500.0)
    dev.close()
    assert fake_gpu.calls[-1][0] == "nvmlShutdown"


def test_not_root_is_measure_only(fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, not_root: None):
    dev = NvmlDevice()
    assert dev.measure_only
    assert dev.knob_values == (1980.0,)  # its highest clock, not the 1755 MHz read at open
    assert not dev.clocks_locked
    dev.set_knob_value(1980.0)  # the unlocked clock's label: accepted, nothing changes
    with pytest.raises(InvalidFrequencyError, match=r"measure-only.*1980 MHz .*, not 1410 MHz"):
        dev.set_knob_value(1410.0)
    dev.close()
    assert lock_calls(fake_gpu) == []


def test_lock_clocks_false_never_touches_clocks_even_as_root(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None
):
    dev = NvmlDevice(control=NvmlControl(lock_clocks=False))
    assert dev.measure_only and dev.knob_values == (1980.0,)
    with locked(dev, 1980.0):
        pass
    dev.close()
    assert lock_calls(fake_gpu) == []


def test_lock_clocks_true_without_root_is_a_permission_error(
    fake_pynvml: types.ModuleType, not_root: None
):
    with pytest.raises(DevicePermissionError, match="needs root"):
        NvmlDevice(control=NvmlControl(lock_clocks=True))


def test_driver_refusing_the_lock_is_a_permission_error(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None, state_dir: Path
):
    fake_gpu.lock_error = 4  # NVML_ERROR_NO_PERMISSION (e.g. a container without the cap)
    dev = NvmlDevice()
    with pytest.raises(DevicePermissionError, match="run the SuperNode as root") as info:
        dev.set_knob_value(1005.0)
    assert info.value.__cause__ is None
    assert not list(state_dir.glob("nvml-*.json"))
    dev.close()


def test_gpu_without_clock_list_is_measure_only(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None
):
    fake_gpu.clocks_supported = False
    dev = NvmlDevice()
    assert dev.measure_only and dev.knob_values == (1755.0,)


def test_meter_uses_energy_counter_when_supported(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, not_root: None
):
    dev = NvmlDevice(sampled=SampledOptions(sample_rate_hz=100.0))
    assert dev.has_energy_counter
    before_mj = fake_gpu.energy_mj
    with dev.measure(WORKLOAD) as meter:
        meter.step(32, lambda: time.sleep(0.2))
    m = meter.measurement
    assert isinstance(m, PowerMeasurement)
    # the sampler reads the counter with every sample (the fake's rises 250 mJ a read)
    reads = (fake_gpu.energy_mj - before_mj) // fake_gpu.energy_step_mj
    assert reads >= len(m.power_samples_w) >= 5
    assert m.energy_source == "counter"
    assert m.counter_energy_j is not None and m.counter_energy_j > 0
    assert m.energy_j == m.counter_energy_j
    assert m.sampled_energy_j == pytest.approx(123.456 * m.time_s)
    assert m.peak_power_w == pytest.approx(123.456)


def test_meter_falls_back_to_sampled_energy(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, not_root: None
):
    fake_gpu.energy_supported = False
    dev = NvmlDevice()
    assert not dev.has_energy_counter
    with dev.measure(WORKLOAD) as meter:
        meter.step(8, lambda: time.sleep(0.01))
    m = meter.measurement
    assert isinstance(m, PowerMeasurement)
    assert m.counter_energy_j is None
    assert m.energy_j == pytest.approx(123.456 * m.time_s)


def test_cap_guard_steps_locked_clock_down(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None
):
    dev = NvmlDevice(sampled=SampledOptions(cap_window_s=0.0, sample_rate_hz=100.0))
    with locked(dev, 1980.0), dev.cap_guard(100.0), dev.measure(WORKLOAD) as meter:
        meter.step(8, lambda: time.sleep(0.03))
    m = meter.measurement
    assert isinstance(m, PowerMeasurement)
    assert m.cap_violations >= 1
    set_calls = [c[1] for c in fake_gpu.calls if c[0] == "nvmlDeviceSetGpuLockedClocks"]
    assert set_calls[0] == (1980, 1980) and set_calls[1] == (1965, 1965)
    assert fake_gpu.locked is None


def test_leftover_lock_is_reset_at_open(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None, state_dir: Path
):
    dev = NvmlDevice()
    dev.set_knob_value(345.0)
    path = next(state_dir.glob("nvml-*.json"))
    data = json.loads(path.read_text())
    data["pid"] = 2**22 + 12345  # no such process
    path.write_text(json.dumps(data))
    NvmlDevice()
    assert fake_gpu.locked is None
    assert not path.exists()


def test_restore_saved_settings_by_uuid(fake_pynvml: types.ModuleType, fake_gpu: FakeGpu):
    fake_gpu.locked = (345, 345)
    restore_saved_settings({"uuid": fake_gpu.uuid, "index": 0})
    assert fake_gpu.locked is None
    with pytest.raises(DeviceError, match="GPU-nope"):
        restore_saved_settings({"uuid": "GPU-nope"})


def test_bytes_name_and_bad_index(fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, not_root: None):
    fake_gpu.name = b"Tesla V100-SXM2-16GB"
    assert NvmlDevice().info.kind == "tesla-v100-sxm2-16gb"
    with pytest.raises(DeviceUnavailableError, match="GPU 3 does not exist"):
        NvmlDevice(index=3)


def test_missing_pynvml_is_unavailable_with_install_hint(no_pynvml: None):
    with pytest.raises(DeviceUnavailableError, match="pip install nvidia-ml-py"):
        NvmlDevice()


@pytest.mark.hardware
def test_real_gpu_measure_only():
    """On a machine with an NVIDIA GPU: read power and energy, never change clocks."""
    try:
        dev = NvmlDevice(control=NvmlControl(lock_clocks=False))
    except DeviceUnavailableError as err:
        pytest.skip(str(err))
    try:
        assert dev.measure_only
        assert dev.read_power_w() > 0
        with dev.measure(WORKLOAD) as meter:
            meter.step(1, lambda: time.sleep(0.2))
        assert meter.measurement.energy_j > 0
    finally:
        dev.close()


# ----------------------------------------------------------------- the permission path


def resets(gpu: FakeGpu) -> int:
    return sum(c[0] == "nvmlDeviceResetGpuLockedClocks" for c in gpu.calls)


def test_refused_lock_and_refused_reset_keep_the_permission_message(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None, state_dir: Path
):
    """Issue 12 §6: the driver refuses the lock (and would refuse the reset too)."""
    fake_gpu.lock_error = 4
    fake_gpu.reset_error = 4
    dev = NvmlDevice()
    with pytest.raises(DevicePermissionError, match=r"no permission to lock.*SuperNode as root"):
        dev.set_knob_value(1005.0)
    assert resets(fake_gpu) == 0  # nothing was locked, so nothing to reset
    assert not list(state_dir.glob("nvml-*.json"))  # no state file left behind
    dev.close()
    # Later opens work, measure-only or not, and never touch the clocks.
    NvmlDevice(control=NvmlControl(lock_clocks=False)).close()
    NvmlDevice().close()
    assert resets(fake_gpu) == 0


def test_refused_step_down_with_failing_reset_keeps_message_and_state(
    fake_pynvml: types.ModuleType,
    fake_gpu: FakeGpu,
    as_root: None,
    state_dir: Path,
    caplog: pytest.LogCaptureFixture,
):
    dev = NvmlDevice()
    dev.set_knob_value(1980.0)
    [path] = state_dir.glob("nvml-*.json")
    fake_gpu.lock_error = 4  # e.g. the permission was taken away mid-run
    fake_gpu.reset_error = 4
    with pytest.raises(DevicePermissionError, match="no permission to lock"):
        dev.step_down_knob_value()
    assert "restoring" in caplog.text and "devices --restore" in caplog.text
    assert path.exists()  # the GPU is still locked at 1980: the state file must stay
    assert fake_gpu.locked == (1980, 1980)


def test_measure_only_open_never_resets_a_leftover_lock(
    fake_pynvml: types.ModuleType,
    fake_gpu: FakeGpu,
    not_root: None,
    state_dir: Path,
    caplog: pytest.LogCaptureFixture,
):
    path = safety.save_state(state_dir, "nvml", fake_gpu.uuid, {"uuid": fake_gpu.uuid})
    data = json.loads(path.read_text())
    data["pid"] = 2**22 + 12345  # no such process
    path.write_text(json.dumps(data))
    fake_gpu.locked = (345, 345)
    fake_gpu.reset_error = 4
    dev = NvmlDevice()
    assert dev.measure_only and dev.knob_values == (1980.0,)  # cells record the 345 MHz
    dev.close()
    assert resets(fake_gpu) == 0 and fake_gpu.locked == (345, 345)
    assert path.exists() and "powerfl devices --restore" in caplog.text


def test_measure_only_open_beside_a_live_owner(
    fake_pynvml: types.ModuleType,
    fake_gpu: FakeGpu,
    not_root: None,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    path = safety.save_state(state_dir, "nvml", fake_gpu.uuid, {"uuid": fake_gpu.uuid})
    data = json.loads(path.read_text())
    data["pid"] = os.getppid()  # alive, not us
    path.write_text(json.dumps(data))
    NvmlDevice().close()  # measures only: the other process keeps its lock
    assert resets(fake_gpu) == 0
    monkeypatch.setattr("os.geteuid", lambda: 0)
    with pytest.raises(DeviceError, match=f"process {os.getppid()} holds"):
        NvmlDevice()  # would lock: refused while the other process holds the GPU


def test_leftover_lock_whose_reset_is_refused_says_run_as_root(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None, state_dir: Path
):
    path = safety.save_state(state_dir, "nvml", fake_gpu.uuid, {"uuid": fake_gpu.uuid})
    data = json.loads(path.read_text())
    data["pid"] = 2**22 + 12345
    path.write_text(json.dumps(data))
    fake_gpu.reset_error = 4
    with pytest.raises(DevicePermissionError, match=r"reset the locked clocks.*as root"):
        NvmlDevice()
    assert fake_gpu.calls[-1][0] == "nvmlShutdown"


def test_lock_whose_state_cannot_be_saved_is_undone(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None, tmp_path: Path
):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    dev = NvmlDevice(sampled=SampledOptions(state_dir=blocker / "state"))
    with pytest.raises(DeviceError, match="POWERFL_STATE_DIR"):
        dev.set_knob_value(1410.0)
    assert fake_gpu.locked is None and resets(fake_gpu) == 1


def test_device_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch, not_root: None):
    gpus = [FakeGpu(uuid=u, name=f"GPU {i}") for i, u in enumerate(UUIDS)]
    nv = make_fake_pynvml(*gpus)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb3,0")
    dev = NvmlDevice(nvml=nv)
    assert (dev.cuda_index, dev.index, dev.uuid) == (0, 2, UUIDS[2])
    assert dev.describe()["cuda-index"] == 0
    dev.close()
    second = NvmlDevice(index=1, nvml=nv)
    assert second.index == 0 and second.name == "GPU 0"
    second.close()


# ----------------------------------------------------------------- instantaneous power


def test_instant_power_is_read_where_offered(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, not_root: None
):
    fake_gpu.instant_power_mw = 250_500
    dev = NvmlDevice()
    assert dev.power_reading == "instant"
    assert dev.read_power_w() == pytest.approx(250.5)  # not the ~1 s average (123.456)
    assert dev.describe()["power-reading"] == "instant"
    # readings every ~100 ms: 10 of them per profiled cell take 1 s
    assert dev.info.sensor.name == "nvml-instant" and dev.info.sensor.min_window_s == 1.0
    fake_gpu.instant_power_mw = None  # a refused read: that sample is the average
    assert dev.read_power_w() == pytest.approx(123.456)
    dev.close()


def test_average_power_where_instant_is_not_offered(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, not_root: None
):
    dev = NvmlDevice()  # the fake GPU reports NOT_SUPPORTED for the field
    assert dev.power_reading == "average"
    assert dev.read_power_w() == pytest.approx(123.456)
    # ~1 s averages: 5 of them per profiled cell take 5 s
    sensor = dev.info.sensor
    assert (sensor.name, sensor.min_window_s, sensor.min_power_samples) == ("nvml-average", 5, 5)
    assert "5 s" in dev.describe()["power-sensor"]
    dev.close()
    del fake_pynvml.nvmlDeviceGetFieldValues  # an old pynvml without field values
    fake_gpu.instant_power_mw = 250_500
    dev = NvmlDevice()
    assert dev.power_reading == "average" and dev.read_power_w() == pytest.approx(123.456)
    dev.close()


def test_nvml_device_has_no_b1_bands(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None
):
    dev = NvmlDevice()
    assert dev.info.b1_bands == ()
    assert dev.info.b1_max_knob_value(math.inf) == 1980.0
    assert dev.info.b1_max_knob_value(100.0) == 1980.0
    dev.close()
