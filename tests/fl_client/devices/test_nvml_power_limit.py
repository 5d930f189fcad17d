"""The GPU power limit as the knob (issue 23 part 6) on the fake ``pynvml``: the grid from
the GPU's range, bad input refused before anything changes, and the original limit put back
on every exit path: restore and close, an exception, SIGTERM/SIGINT, and after SIGKILL
from the state file at the next open or ``powerfl devices --restore``. No real GPU is
touched."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from fl_client.devices import (
    GPU_FREQ_MHZ,
    GPU_POWER_LIMIT_W,
    DeviceError,
    DeviceOptions,
    DevicePermissionError,
    DeviceUnavailableError,
    InvalidFrequencyError,
    Workload,
    locked,
    open_device,
    safety,
)
from fl_client.devices.cli import devices_report, restore_command
from fl_client.devices.nvml import NvmlControl, NvmlDevice, power_limit_grid_w
from fl_client.devices.sampler import PowerMeasurement, SampledOptions
from fl_client.settings import REPO_ROOT
from fl_client.settings_table import device_options
from tests.fl_client.devices.conftest import FakeGpu, await_line

WORKLOAD = Workload("resnet18", (3, 32, 32), 1e9)
ORIGINAL_MW = 650_000  # an admin's limit, not the GPU's default: that is what comes back
H100_GRID_W = tuple(200.0 + 25.0 * i for i in range(21))  # 200, 225, ..., 700 W


def limit_sets(gpu: FakeGpu) -> list[int]:
    return [mw for name, mw in gpu.calls if name == "nvmlDeviceSetPowerManagementLimit"]


def state_files(state_dir: Path) -> list[Path]:
    return safety.leftover_states(state_dir)


@pytest.fixture
def h100(fake_gpu: FakeGpu) -> FakeGpu:
    fake_gpu.power_limit_mw = ORIGINAL_MW
    return fake_gpu


# --------------------------------------------------------------------------- the grid


def test_the_grid_steps_down_from_the_highest_limit_to_the_lowest():
    assert power_limit_grid_w(200.0, 700.0, 25.0) == H100_GRID_W
    assert power_limit_grid_w(100.0, 250.0, 40.0) == (100.0, 130.0, 170.0, 210.0, 250.0)
    assert power_limit_grid_w(300.0, 300.0, 25.0) == (300.0,)
    for step in (0, -5, float("nan"), float("inf"), "25", True):
        with pytest.raises(ValueError, match=r"power-limit-step-w: must be a number of W > 0"):
            power_limit_grid_w(200.0, 700.0, step)  # type: ignore[arg-type]


def test_the_power_limit_knob_selects_over_watts(
    fake_pynvml: types.ModuleType, h100: FakeGpu, as_root: None
):
    dev = NvmlDevice(control=NvmlControl(knob="power-limit"))
    assert dev.knob is GPU_POWER_LIMIT_W and not dev.measure_only
    assert dev.gpu_freqs_mhz == H100_GRID_W  # the knob's values, W
    assert not dev.clocks_locked  # cells record the clock sampled while they ran
    d = dev.describe()
    assert d["mode"] == "power limit" and d["knob"] == "power-limit"
    assert d["power-limits-w"] == list(H100_GRID_W) and "gpu-freqs-mhz" not in d
    assert (d["power-limit-w"], d["power-limit-range-w"]) == (650.0, [200.0, 700.0])
    assert d["power-limit-default-w"] == 700.0
    assert limit_sets(h100) == []  # opening and describing change nothing
    dev.close()
    coarse = NvmlDevice(control=NvmlControl(knob="power-limit", power_limit_step_w=150.0))
    assert coarse.gpu_freqs_mhz == (200.0, 250.0, 400.0, 550.0, 700.0)
    coarse.close()


# --------------------------------------------------------------------------- restore paths


def test_set_and_restore_the_original_limit(
    fake_pynvml: types.ModuleType, h100: FakeGpu, as_root: None, state_dir: Path
):
    dev = NvmlDevice(control=NvmlControl(knob="power-limit"))
    with locked(dev, 300.0):
        assert h100.power_limit_mw == 300_000
        assert dev.power_limit_w() == 300.0
        [path] = state_files(state_dir)
        saved = json.loads(path.read_text())["settings"]
        assert saved == {"uuid": h100.uuid, "index": 0, "power-limit-mw": ORIGINAL_MW}
        dev.set_gpu_freq_mhz(250.0)  # a second change keeps the first saved limit
        assert json.loads(path.read_text())["settings"]["power-limit-mw"] == ORIGINAL_MW
    assert h100.power_limit_mw == ORIGINAL_MW  # the limit found, not the default 700 W
    assert state_files(state_dir) == []
    assert limit_sets(h100) == [300_000, 250_000, ORIGINAL_MW]
    dev.restore()  # idempotent
    dev.close()
    assert limit_sets(h100) == [300_000, 250_000, ORIGINAL_MW]
    assert not [c for c in h100.calls if "Locked" in c[0]]  # the clocks are never touched


def test_an_exception_and_close_restore(
    fake_pynvml: types.ModuleType, h100: FakeGpu, as_root: None, state_dir: Path
):
    dev = NvmlDevice(control=NvmlControl(knob="power-limit"))
    with pytest.raises(RuntimeError, match="training crashed"), locked(dev, 400.0):
        raise RuntimeError("training crashed")
    assert h100.power_limit_mw == ORIGINAL_MW and state_files(state_dir) == []
    dev.set_gpu_freq_mhz(200.0)
    dev.close()
    assert h100.power_limit_mw == ORIGINAL_MW and state_files(state_dir) == []


def test_a_failing_restore_is_loud_and_keeps_the_state_file(
    fake_pynvml: types.ModuleType,
    h100: FakeGpu,
    as_root: None,
    state_dir: Path,
    caplog: pytest.LogCaptureFixture,
):
    dev = NvmlDevice(control=NvmlControl(knob="power-limit"))
    dev.set_gpu_freq_mhz(300.0)
    h100.limit_error = 4  # e.g. the permission was taken away mid-run
    with (
        caplog.at_level(logging.ERROR),
        pytest.raises(
            DevicePermissionError, match=r"no permission to restore the power limit of .* to 650 W"
        ),
    ):
        dev.restore()
    assert "devices --restore" in caplog.text
    [path] = state_files(state_dir)  # the GPU is still at 300 W: the file must stay
    assert h100.power_limit_mw == 300_000
    h100.limit_error = None
    dev.restore()  # a later try puts it back
    assert h100.power_limit_mw == ORIGINAL_MW and not path.exists()


def test_a_refused_first_set_changes_nothing_and_leaves_no_file(
    fake_pynvml: types.ModuleType, h100: FakeGpu, as_root: None, state_dir: Path
):
    h100.limit_error = 4  # NVML_ERROR_NO_PERMISSION (e.g. a container without the cap)
    dev = NvmlDevice(control=NvmlControl(knob="power-limit"))
    with pytest.raises(DevicePermissionError, match="no permission to set the power limit"):
        dev.set_gpu_freq_mhz(300.0)
    assert state_files(state_dir) == [] and h100.power_limit_mw == ORIGINAL_MW
    dev.close()
    assert limit_sets(h100) == [300_000]  # the refused try, and no restore of nothing


def test_a_refused_step_down_puts_the_original_back(
    fake_pynvml: types.ModuleType, h100: FakeGpu, as_root: None, state_dir: Path
):
    dev = NvmlDevice(control=NvmlControl(knob="power-limit"))
    dev.set_gpu_freq_mhz(300.0)
    calls = {"n": 0}
    real_set = fake_pynvml.nvmlDeviceSetPowerManagementLimit

    def refuse_once(h: FakeGpu, mw: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise fake_pynvml.NVMLError(999)  # NVML_ERROR_UNKNOWN, once
        real_set(h, mw)

    fake_pynvml.nvmlDeviceSetPowerManagementLimit = refuse_once  # type: ignore[attr-defined]
    with pytest.raises(DeviceError, match=r"setting the power limit .* to 275 W failed"):
        dev.step_down_gpu_freq_mhz()
    assert h100.power_limit_mw == ORIGINAL_MW and state_files(state_dir) == []
    dev.close()


def test_cap_guard_steps_the_limit_down(
    fake_pynvml: types.ModuleType, h100: FakeGpu, as_root: None
):
    dev = NvmlDevice(
        control=NvmlControl(knob="power-limit"),
        sampled=SampledOptions(cap_window_s=0.0, sample_rate_hz=100.0),
    )
    with locked(dev, 700.0), dev.cap_guard(100.0), dev.measure(WORKLOAD) as meter:
        meter.step(8, lambda: time.sleep(0.03))  # the fake draws 123.456 W > 100 W
    m = meter.measurement
    assert isinstance(m, PowerMeasurement) and m.cap_violations >= 1
    assert limit_sets(h100)[:2] == [700_000, 675_000]
    assert h100.power_limit_mw == ORIGINAL_MW


# --------------------------------------------------------------------------- bad input


def test_a_limit_outside_the_range_is_refused_before_anything_changes(
    fake_pynvml: types.ModuleType, h100: FakeGpu, as_root: None, state_dir: Path
):
    dev = NvmlDevice(control=NvmlControl(knob="power-limit"))
    for watts in (800.0, 150.0, float("nan")):
        with pytest.raises(
            InvalidFrequencyError,
            match=r"gpu-power-limit-w: .* W is outside the power-limit range of "
            r"NVIDIA H100 80GB HBM3, 200–700 W",
        ):
            dev.set_gpu_freq_mhz(watts)
    with pytest.raises(InvalidFrequencyError, match=r"not on the power-limit grid.*200, 225"):
        dev.set_gpu_freq_mhz(310.0)
    assert limit_sets(h100) == [] and state_files(state_dir) == []
    dev.close()


def test_the_power_limit_knob_needs_root_a_range_and_no_measure_only(
    fake_pynvml: types.ModuleType, h100: FakeGpu, not_root: None, monkeypatch: pytest.MonkeyPatch
):
    with pytest.raises(DevicePermissionError, match=r"setting the power limit .* needs root"):
        NvmlDevice(control=NvmlControl(knob="power-limit"))
    with pytest.raises(ValueError, match="lock-clocks = false means change nothing"):
        NvmlDevice(control=NvmlControl(knob="power-limit", lock_clocks=False))
    monkeypatch.setattr("os.geteuid", lambda: 0)
    h100.power_limit_range_mw = None  # NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(DeviceUnavailableError, match="reports no power-limit range"):
        NvmlDevice(control=NvmlControl(knob="power-limit"))
    with pytest.raises(ValueError, match="knob: unknown value 'watts'; allowed: frequency, "):
        NvmlDevice(control=NvmlControl(knob="watts"))
    assert limit_sets(h100) == []


def test_auto_takes_the_clocks_where_they_lock_else_the_power_limit(
    fake_pynvml: types.ModuleType, h100: FakeGpu, as_root: None, monkeypatch: pytest.MonkeyPatch
):
    dev = NvmlDevice(control=NvmlControl(knob="auto"))
    assert dev.knob is GPU_FREQ_MHZ and dev.clocks_locked
    dev.close()
    h100.clocks_supported = False  # no clock list to lock
    dev = NvmlDevice(control=NvmlControl(knob="auto"))
    assert dev.knob is GPU_POWER_LIMIT_W and dev.gpu_freqs_mhz == H100_GRID_W
    dev.close()
    monkeypatch.setattr("os.geteuid", lambda: 1000)  # without root: measure only
    dev = NvmlDevice(control=NvmlControl(knob="auto"))
    assert dev.knob is GPU_FREQ_MHZ and dev.measure_only
    dev.close()


def test_options_name_the_key_and_the_allowed_values(tmp_path: Path):
    with pytest.raises(ValueError, match=r"knob: unknown value 'mhz'; allowed: frequency, "
                       r"power-limit, auto"):  # fmt: skip
        device_options({"knob": "mhz"})
    with pytest.raises(ValueError, match="lock-clocks = false means change nothing"):
        device_options({"knob": "power-limit", "lock-clocks": "false"})
    with pytest.raises(ValueError, match="power-limit-step-w: expected a finite number > 0"):
        device_options({"knob": "power-limit", "power-limit-step-w": 0})
    opts = device_options({"knob": "Power-Limit", "power-limit-step-w": "50"})
    assert (opts.knob, opts.power_limit_step_w) == ("power-limit", 50.0)
    assert device_options({}).knob == "frequency"
    for backend in ("simulated", "jetson"):
        with pytest.raises(ValueError, match=f"knob: power-limit needs .* the {backend} backend"):
            open_device("jetson-nano", backend, options=opts)


def test_a_replay_table_keeps_its_own_knob():
    example = REPO_ROOT / "configs" / "replay"
    watts = str(example / "example-illustrative-gpu-power-limit.csv")
    mhz = str(example / "example-illustrative-jetson-nano-resnet18.csv")
    for knob in ("power-limit", "auto"):
        dev = open_device("", "replay", options=DeviceOptions(replay_table=watts, knob=knob))
        assert dev.knob is GPU_POWER_LIMIT_W  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"knob: frequency was asked.*power_limit_w"):
        open_device("", "replay", options=DeviceOptions(replay_table=watts))
    with pytest.raises(ValueError, match=r"knob: power-limit was asked.*freq_mhz"):
        open_device("", "replay", options=DeviceOptions(replay_table=mhz, knob="power-limit"))


def test_devices_shows_the_range_without_root(
    fake_pynvml: types.ModuleType, h100: FakeGpu, not_root: None
):
    report = devices_report("", "nvml", DeviceOptions())
    d = report["device"]
    assert (d["mode"], d["knob"]) == ("measure-only", "frequency")
    assert d["power-limit-range-w"] == [200.0, 700.0] and d["power-limit-w"] == 650.0
    assert limit_sets(h100) == [] and not [c for c in h100.calls if "Locked" in c[0]]
    h100.power_limit_range_mw = None
    assert "power-limit-range-w" not in devices_report("", "nvml", DeviceOptions())["device"]


# --------------------------------------------------------------------------- signals, SIGKILL

CHILD = """
import os, sys, time
from pathlib import Path
os.geteuid = lambda: 0  # as root, on the fake GPU
from tests.fl_client.devices.conftest import FakeGpu, make_fake_pynvml
from fl_client.devices.nvml import NvmlControl, NvmlDevice
from fl_client.devices.sampler import SampledOptions
limit_file = Path(sys.argv[1])
gpu = FakeGpu(power_limit_mw=int(limit_file.read_text()))
nv = make_fake_pynvml(gpu)
real_set = nv.nvmlDeviceSetPowerManagementLimit
def set_and_persist(h, mw):  # the GPU outlives the process: its limit lives in a file
    real_set(h, mw)
    tmp = limit_file.with_suffix(".tmp")
    tmp.write_text(str(h.power_limit_mw))
    os.replace(tmp, limit_file)
nv.nvmlDeviceSetPowerManagementLimit = set_and_persist
sampled = SampledOptions(state_dir=sys.argv[2])
dev = NvmlDevice(nvml=nv, control=NvmlControl(knob="power-limit"), sampled=sampled)
dev.set_gpu_freq_mhz(300.0)
print("SET", flush=True)
if sys.argv[3] == "raise":
    raise RuntimeError("training crashed")
time.sleep(60)
"""


def start_child(limit_file: Path, state_dir: Path, mode: str = "wait") -> subprocess.Popen[str]:
    limit_file.write_text(str(ORIGINAL_MW))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(limit_file), str(state_dir), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    await_line(proc, "SET", 60.0, "child did not set the limit")
    if mode == "wait":
        assert int(limit_file.read_text()) == 300_000
    return proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_restores_the_limit(tmp_path: Path, state_dir: Path, signum: int):
    limit_file = tmp_path / "limit-mw"
    proc = start_child(limit_file, state_dir)
    assert len(state_files(state_dir)) == 1
    proc.send_signal(signum)
    proc.wait(timeout=20)
    assert int(limit_file.read_text()) == ORIGINAL_MW
    assert state_files(state_dir) == []
    assert proc.returncode == -signum  # still ends by the signal (KeyboardInterrupt re-raises it)


def test_an_uncaught_exception_restores_the_limit(tmp_path: Path, state_dir: Path):
    limit_file = tmp_path / "limit-mw"
    proc = start_child(limit_file, state_dir, mode="raise")
    proc.wait(timeout=20)
    assert proc.returncode == 1
    assert int(limit_file.read_text()) == ORIGINAL_MW and state_files(state_dir) == []


def _killed(tmp_path: Path, state_dir: Path) -> FakeGpu:
    """A child set 300 W and was SIGKILLed: the GPU it leaves, and its state file."""
    limit_file = tmp_path / "limit-mw"
    proc = start_child(limit_file, state_dir)
    proc.kill()
    proc.wait(timeout=20)
    [path] = state_files(state_dir)
    saved = safety.load_state(path)
    assert saved.settings["power-limit-mw"] == ORIGINAL_MW and not saved.owner_alive()
    return FakeGpu(power_limit_mw=int(limit_file.read_text()))


def test_sigkill_leaves_a_state_file_that_the_next_open_restores(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch, as_root: None
):
    gpu = _killed(tmp_path, state_dir)
    assert gpu.power_limit_mw == 300_000  # nothing could run
    from tests.fl_client.devices.conftest import make_fake_pynvml

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    dev = NvmlDevice(
        nvml=make_fake_pynvml(gpu),
        control=NvmlControl(knob="power-limit"),
        sampled=SampledOptions(state_dir=state_dir),
    )
    assert gpu.power_limit_mw == ORIGINAL_MW and state_files(state_dir) == []
    dev.close()
    # A clock-knob open as root restores a leftover power limit too.
    gpu = _killed(tmp_path, state_dir)
    NvmlDevice(nvml=make_fake_pynvml(gpu), sampled=SampledOptions(state_dir=state_dir)).close()
    assert gpu.power_limit_mw == ORIGINAL_MW and state_files(state_dir) == []


def test_sigkill_then_measure_only_open_warns_and_restore_command_restores(
    tmp_path: Path,
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    not_root: None,
    caplog: pytest.LogCaptureFixture,
):
    gpu = _killed(tmp_path, state_dir)
    from tests.fl_client.devices.conftest import make_fake_pynvml

    module = make_fake_pynvml(gpu)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    NvmlDevice(
        sampled=SampledOptions(state_dir=state_dir)
    ).close()  # measure-only: leaves it, says so
    assert gpu.power_limit_mw == 300_000 and len(state_files(state_dir)) == 1
    assert "power limit" in caplog.text and "powerfl devices --restore" in caplog.text
    out = io.StringIO()
    assert restore_command(str(state_dir), out=out) == 0
    assert gpu.power_limit_mw == ORIGINAL_MW and state_files(state_dir) == []
    assert out.getvalue().startswith("restored")
