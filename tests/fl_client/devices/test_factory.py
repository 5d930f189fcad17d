"""The factory (backend = auto | simulated | jetson | nvml | replay), node-config options,
imports without vendor libraries, and the ``powerfl devices`` command."""

from __future__ import annotations

import argparse
import io
import json
import logging
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fl_client.devices import (
    BACKENDS,
    Device,
    DeviceOptions,
    DeviceUnavailableError,
    cap_guard,
    detect_backends,
    open_device,
)
from fl_client.devices.cli import add_devices_parser, cmd_devices
from fl_client.devices.jetson import JetsonDevice
from fl_client.devices.nvml import NvmlDevice
from fl_client.devices.replay import ReplayDevice
from fl_client.devices.sampler import SampledOptions
from fl_client.settings import REPO_ROOT
from tests.fl_client.devices.fakes_sysfs import build_tree

EXAMPLE = str(REPO_ROOT / "configs" / "replay" / "example-illustrative-jetson-nano-resnet18.csv")


@pytest.fixture
def no_jtop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jtop", None)


def test_every_module_imports_without_vendor_libraries():
    code = (
        "import sys; sys.modules['pynvml'] = None; sys.modules['jtop'] = None\n"
        "import fl_client.devices, fl_client.devices.jetson, fl_client.devices.nvml\n"
        "import fl_client.devices.replay, fl_client.devices.safety, fl_client.devices.sampler\n"
        "import fl_client.devices.cli, fl_client.devices.simulated\n"
        "import fl_client.devices.descriptors, fl_client.devices.guard\n"
        "import fl_client.devices.jetson_power, fl_client.devices.jetson_sysfs\n"
        "import fl_client.devices.nvml_lib\n"
        "bad = [m for m in ('torch', 'flwr', 'fl_client.task', 'fl_client.selector', "
        "'fl_client.profiler', 'fl_client.node', 'fl_client.settings') if m in sys.modules]\n"
        "assert not bad, f'the device layer must not import {bad}'\n"
        "print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_unknown_backend_names_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed: auto, simulated, jetson, nvml, replay"):
        open_device("jetson-nano", "tpu")
    assert BACKENDS == ("auto", "simulated", "jetson", "nvml", "replay")


def test_simulated_backend_unchanged():
    from fl_client.devices.simulated import SimulatedDevice

    dev = open_device("jetson-nano", "simulated", seed=3)
    assert isinstance(dev, SimulatedDevice)
    assert dev.info.backend == "simulated"
    dev.close()


def test_jetson_backend_with_options(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    options = DeviceOptions(sysfs_root=str(fake.root), state_dir=str(state_dir), cap_window_s=2)
    dev = open_device("jetson-orin-nano", "jetson", options=options)
    assert isinstance(dev, JetsonDevice) and isinstance(dev, Device)
    assert dev.cap_window_s == 2
    dev.set_gpu_freq_mhz(612.0)
    assert fake.max_hz == 612_000_000
    dev.close()
    assert fake.max_hz == 1_020_000_000


def test_auto_prefers_the_jetson(tmp_path: Path, no_pynvml: None):
    fake = build_tree(tmp_path / "root", "xavier-nx-jp5")
    dev = open_device("", "auto", options=DeviceOptions(sysfs_root=str(fake.root)))
    assert isinstance(dev, JetsonDevice) and dev.info.kind == "jetson-xavier-nx"


def test_auto_falls_back_to_nvml(
    tmp_path: Path, fake_pynvml: types.ModuleType, not_root: None, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="fl_client.devices")
    dev = open_device("", "auto", options=DeviceOptions(sysfs_root=str(tmp_path)))
    assert isinstance(dev, NvmlDevice) and dev.measure_only
    assert "passed over jetson: jetson: no GPU devfreq node" in caplog.text
    assert "using nvml" in caplog.text


def test_auto_falls_back_to_replay_and_says_why(
    tmp_path: Path, no_pynvml: None, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="fl_client.devices")
    options = DeviceOptions(sysfs_root=str(tmp_path), replay_table=EXAMPLE)
    dev = open_device("jetson-nano", "auto", options=options)
    assert isinstance(dev, ReplayDevice)
    assert "pip install nvidia-ml-py" in caplog.text


def test_auto_with_nothing_lists_every_reason(tmp_path: Path, no_pynvml: None):
    with pytest.raises(DeviceUnavailableError) as info:
        open_device("no-such-board", "auto", options=DeviceOptions(sysfs_root=str(tmp_path)))
    msg = str(info.value)
    for part in ("jetson:", "nvml:", "replay: no replay-table given", "simulated:"):
        assert part in msg


def test_cap_guard_helper_arms_guarded_backends_only(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    dev = open_device("", "jetson", options=DeviceOptions(sysfs_root=str(fake.root)))
    assert isinstance(dev, JetsonDevice)
    assert dev._new_guard() is None  # profiling: never guarded
    with cap_guard(dev, 4.5, window_s=0.25):
        guard = dev._new_guard()
        assert guard is not None and guard.p_max_w == 4.5 and guard.window_s == 0.25
    assert dev._new_guard() is None
    with cap_guard(dev, float("inf")):
        assert dev._new_guard() is None  # no cap, nothing to guard
    with pytest.raises(ValueError, match="cap-window-s"), cap_guard(dev, 4.5, window_s=-1):
        pass
    replay = open_device("jetson-nano", "replay", options=DeviceOptions(replay_table=EXAMPLE))
    twin = open_device("jetson-nano", "simulated")
    for emulated in (replay, twin):  # the emulated backends have the same guard
        assert emulated._new_guard() is None  # type: ignore[attr-defined]
        with cap_guard(emulated, 4.5, window_s=0.5):
            guard = emulated._new_guard()  # type: ignore[attr-defined]
            assert guard is not None and (guard.p_max_w, guard.window_s) == (4.5, 0.5)

    class Unguarded:  # e.g. a third-party Device without a guard: nothing to arm
        pass

    with cap_guard(Unguarded(), 4.5):  # type: ignore[arg-type]
        pass


def test_replay_backend_needs_a_table():
    with pytest.raises(DeviceUnavailableError, match="replay-table"):
        open_device("jetson-nano", "replay")
    dev = open_device("jetson-nano", "replay", options=DeviceOptions(replay_table=EXAMPLE))
    assert dev.info.backend == "replay"


def test_nvml_backend_unavailable_without_pynvml(no_pynvml: None):
    with pytest.raises(DeviceUnavailableError, match="nvidia-ml-py"):
        open_device("", "nvml")


def test_power_limit_with_lock_clocks_false_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"knob: power-limit .* lock-clocks = false"):
        DeviceOptions(lock_clocks=False, knob="power-limit")


def test_sampled_options_carry_the_state_folder_rate_and_window():
    opts = DeviceOptions(state_dir="/s", sample_rate_hz=40.0, cap_window_s=2.0)
    assert opts.sampled() == SampledOptions("/s", 40.0, 2.0)
    assert DeviceOptions().sampled() == SampledOptions()


def test_detect_backends(tmp_path: Path, fake_pynvml: types.ModuleType):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    status = {s.backend: s for s in detect_backends("", DeviceOptions(sysfs_root=str(fake.root)))}
    assert status["jetson"].available and "POM_5V_IN" in status["jetson"].reason
    assert status["nvml"].available and "1 NVIDIA GPU" in status["nvml"].reason
    assert not status["replay"].available
    assert set(status) == {"jetson", "nvml", "replay", "simulated"}


def run_cli(argv: list[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="powerfl")
    add_devices_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    out = io.StringIO()
    return cmd_devices(args, out=out), out.getvalue()


def test_devices_command_text(tmp_path: Path, no_pynvml: None, no_jtop: None):
    fake = build_tree(tmp_path / "root", "agx-orin-jp5")
    code, text = run_cli(["devices", "--sysfs-root", str(fake.root)])
    assert code == 0
    assert "jetson     yes" in text and "nvml       no" in text
    assert "17000000.ga10b" in text
    assert "114.75, 216.75" in text and "1300.5" in text
    assert "nvhost_podgov" in text
    assert "VDD_GPU_SOC 10.38 W" in text
    assert "sum(VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0+VDDQ_VDD2_1V8AO)" in text


def test_devices_command_json_and_error(tmp_path: Path, no_pynvml: None):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    code, text = run_cli(
        ["devices", "--json", "--backend", "jetson", "--sysfs-root", str(fake.root)]
    )
    report = json.loads(text)
    assert code == 0
    assert report["device"]["min-freq-mhz"] == 76.8
    assert report["device"]["rails-w"]["POM_5V_IN"] == pytest.approx(3.149)
    code, text = run_cli(["devices", "--backend", "jetson", "--sysfs-root", str(tmp_path)])
    assert code == 1 and "DeviceUnavailableError" in text


def test_devices_restore_flag(tmp_path: Path, state_dir: Path):
    state_dir.mkdir()
    code, text = run_cli(["devices", "--restore", "--state-dir", str(state_dir)])
    assert code == 0 and "nothing to restore" in text


def test_restore_from_a_mistyped_state_dir_is_an_error(
    tmp_path: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]
):
    state_dir.mkdir()
    typo = tmp_path / "powerfl-stat"
    code, text = run_cli(["devices", "--restore", "--state-dir", str(typo)])
    err = capsys.readouterr().err
    assert code == 2 and text == ""
    assert f"state directory {typo} (--state-dir) does not exist" in err
    (tmp_path / "a-file").write_text("")
    code, _ = run_cli(["devices", "--restore", "--state-dir", str(tmp_path / "a-file")])
    assert code == 2 and "is not a directory" in capsys.readouterr().err


def test_restore_names_the_env_var_of_a_missing_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv("POWERFL_STATE_DIR", str(tmp_path / "nope"))
    code, _ = run_cli(["devices", "--restore"])
    assert code == 2 and "($POWERFL_STATE_DIR) does not exist" in capsys.readouterr().err
    monkeypatch.delenv("POWERFL_STATE_DIR")  # the default folder: absent until a first lock
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    code, text = run_cli(["devices", "--restore"])
    assert code == 0 and "nothing to restore" in text


def test_devices_command_accepts_the_sysfs_mount(tmp_path: Path, no_pynvml: None, no_jtop: None):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    code, text = run_cli(["devices", "--backend", "jetson", "--sysfs-root", str(fake.root / "sys")])
    assert code == 0 and "57000000.gpu" in text and "sys/sys" not in text
    assert "jetson-nano" in text  # the kind, from the /proc next to the mount
    assert "b1-bands" in text and "≥4.5 W → 307.2 MHz" in text


def test_devices_command_shows_and_chooses_the_cap_rail(
    tmp_path: Path, no_pynvml: None, no_jtop: None
):
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    code, text = run_cli(["devices", "--sysfs-root", str(fake.root)])
    assert code == 0 and "VDD_IN  (the cap applies to it; choose with --power-rails)" in text
    assert "VDD_CPU_GPU_CV 3.22 W" in text  # every rail, to choose from
    argv = ["devices", "--sysfs-root", str(fake.root), "--power-rails", "VDD_CPU_GPU_CV,VDD_SOC"]
    code, text = run_cli(argv)
    assert code == 0 and "sum(VDD_CPU_GPU_CV+VDD_SOC)  (the cap applies" in text
    code, text = run_cli([*argv[:3], "--power-rails", "VDD_GPU", "--json"])
    report = json.loads(text)
    assert code == 1 and "power-rails: VDD_GPU not found" in report["error"]
    assert "available rails: VDD_IN, VDD_CPU_GPU_CV, VDD_SOC" in report["error"]


def test_power_rails_on_a_backend_without_rails_is_an_error(tmp_path: Path):
    code, text = run_cli(
        ["devices", "--backend", "simulated", "--kind", "jetson-nano", "--power-rails", "VDD_IN"]
    )
    assert code == 1 and "power-rails: only the jetson backend" in text
