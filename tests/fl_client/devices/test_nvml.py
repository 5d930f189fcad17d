"""The nvml backend against a fake ``pynvml``: unit conversions, locked clocks when root,
measure-only otherwise, restore, energy counter. No real GPU clock is ever touched."""

from __future__ import annotations

import json
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
)
from fl_client.devices.nvml import NvmlDevice, gpu_count, restore_saved_settings
from fl_client.devices.sampler import PowerMeasurement
from tests.fl_client.devices.conftest import FakeGpu

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
    assert dev.current_gpu_freq_mhz() == 1755.0
    dev.close()


def test_root_locks_supported_clocks_and_restores(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None, state_dir: Path
):
    dev = NvmlDevice("h100")
    assert not dev.measure_only
    assert dev.gpu_freqs_mhz == (345.0, 1005.0, 1410.0, 1965.0, 1980.0)  # ascending
    with locked(dev, 1410.0):
        assert fake_gpu.locked == (1410, 1410)
        assert dev.current_gpu_freq_mhz() == 1410.0
        saved = json.loads(next(state_dir.glob("nvml-*.json")).read_text())
        assert saved["settings"]["uuid"] == fake_gpu.uuid
    assert fake_gpu.locked is None
    assert lock_calls(fake_gpu)[-1] == ("nvmlDeviceResetGpuLockedClocks", ())
    assert not list(state_dir.glob("nvml-*.json"))
    dev.restore()  # idempotent: no second reset
    assert sum(c[0] == "nvmlDeviceResetGpuLockedClocks" for c in fake_gpu.calls) == 1
    with pytest.raises(InvalidFrequencyError, match="allowed: 345, 1005"):
        dev.set_gpu_freq_mhz(1500.0)
    dev.close()
    assert fake_gpu.calls[-1][0] == "nvmlShutdown"


def test_not_root_is_measure_only(fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, not_root: None):
    dev = NvmlDevice()
    assert dev.measure_only
    assert dev.gpu_freqs_mhz == (1755.0,)
    dev.set_gpu_freq_mhz(1755.0)  # the clock it runs at: accepted, nothing changes
    with pytest.raises(InvalidFrequencyError, match=r"measure-only.*1755 MHz, not 1410 MHz"):
        dev.set_gpu_freq_mhz(1410.0)
    dev.close()
    assert lock_calls(fake_gpu) == []


def test_lock_clocks_false_never_touches_clocks_even_as_root(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None
):
    dev = NvmlDevice(lock_clocks=False)
    assert dev.measure_only and dev.gpu_freqs_mhz == (1755.0,)
    with locked(dev, 1755.0):
        pass
    dev.close()
    assert lock_calls(fake_gpu) == []


def test_lock_clocks_true_without_root_is_a_permission_error(
    fake_pynvml: types.ModuleType, not_root: None
):
    with pytest.raises(DevicePermissionError, match="needs root"):
        NvmlDevice(lock_clocks=True)


def test_driver_refusing_the_lock_is_a_permission_error(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None, state_dir: Path
):
    fake_gpu.lock_error = 4  # NVML_ERROR_NO_PERMISSION (e.g. a container without the cap)
    dev = NvmlDevice()
    with pytest.raises(DevicePermissionError, match="run the SuperNode as root") as info:
        dev.set_gpu_freq_mhz(1005.0)
    assert info.value.__cause__ is None
    assert not list(state_dir.glob("nvml-*.json"))
    dev.close()


def test_gpu_without_clock_list_is_measure_only(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, as_root: None
):
    fake_gpu.clocks_supported = False
    dev = NvmlDevice()
    assert dev.measure_only and dev.gpu_freqs_mhz == (1755.0,)


def test_meter_uses_energy_counter_when_supported(
    fake_pynvml: types.ModuleType, fake_gpu: FakeGpu, not_root: None
):
    dev = NvmlDevice(sample_rate_hz=100.0)
    assert dev.has_energy_counter
    with dev.measure(WORKLOAD) as meter:
        meter.step(32, lambda: time.sleep(0.02))
    m = meter.measurement
    assert isinstance(m, PowerMeasurement)
    # the fake counter goes up 250 mJ per read: one read before and one after the step
    assert m.counter_energy_j == pytest.approx(0.25)
    assert m.energy_j == pytest.approx(0.25)
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
    dev = NvmlDevice(cap_window_s=0.0, sample_rate_hz=100.0)
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
    dev.set_gpu_freq_mhz(345.0)
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
    assert gpu_count() == 1


def test_missing_pynvml_is_unavailable_with_install_hint(no_pynvml: None):
    with pytest.raises(DeviceUnavailableError, match="pip install nvidia-ml-py"):
        NvmlDevice()


@pytest.mark.hardware
def test_real_gpu_measure_only():
    """On a machine with an NVIDIA GPU: read power and energy, never change clocks."""
    try:
        dev = NvmlDevice(lock_clocks=False)
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
