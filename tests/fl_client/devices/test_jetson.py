"""The jetson backend on fake sysfs trees of Nano (JP4), TX2, Xavier NX, AGX Orin (JP5), Orin
Nano (JP6): discovery, frequency tables, power rails, lock/restore, permissions, cap guard."""

from __future__ import annotations

import errno
import json
import math
import os
import subprocess
import sys
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
    base,
    jetson_power,
    jetson_sysfs,
    locked,
)
from fl_client.devices.jetson import JetsonDevice
from fl_client.devices.jetson_sysfs import find_gpu_devfreq, write_sysfs
from fl_client.devices.sampler import PowerMeasurement, SampledOptions
from tests.fl_client.devices.fakes_sysfs import BOARDS, FakeJetson, build_tree

# The tables as published for each board (MHz), independent of the fake's own encoding.
EXPECTED_MHZ = {
    "nano-jp4": [76.8, 153.6, 230.4, 307.2, 384.0, 460.8, 537.6, 614.4, 691.2, 768.0, 844.8,
                 921.6],
    "tx2-jp4": [140.25, 229.5, 318.75, 408.0, 497.25, 586.5, 675.75, 765.0, 854.25, 943.5,
                1032.75, 1122.0, 1211.25, 1300.5],
    "xavier-nx-jp5": [114.75, 204.0, 306.0, 408.0, 510.0, 599.25, 701.25, 752.25, 803.25,
                      854.25, 905.25, 956.25, 1007.25, 1058.25, 1109.25],
    "agx-orin-jp5": [114.75, 216.75, 318.75, 420.75, 522.75, 624.75, 726.75, 828.75, 930.75,
                     1032.75, 1134.75, 1236.75, 1300.5],
    "orin-nano-jp6": [306.0, 408.0, 510.0, 612.0, 714.0, 816.0, 918.0, 1020.0],
}  # fmt: skip
WORKLOAD = Workload("cnn", (3, 32, 32), 1e6)


@pytest.fixture(params=sorted(BOARDS))
def board(request: pytest.FixtureRequest, tmp_path: Path) -> FakeJetson:
    return build_tree(tmp_path / "root", request.param)


def open_jetson(
    fake: FakeJetson,
    state_dir: Path,
    *,
    sample_rate_hz: float = SampledOptions.sample_rate_hz,
    cap_window_s: float = SampledOptions.cap_window_s,
    **kwargs: object,
) -> JetsonDevice:
    sampled = SampledOptions(state_dir, sample_rate_hz, cap_window_s)
    return JetsonDevice(fake.board.kind, root=fake.root, sampled=sampled, **kwargs)  # type: ignore[arg-type]


def test_discovers_gpu_node_table_rail_kind_and_memory(board: FakeJetson, state_dir: Path):
    assert find_gpu_devfreq(board.root) == board.class_node
    dev = JetsonDevice("", root=board.root, sampled=SampledOptions(state_dir=state_dir))
    assert dev.devfreq_node.name == board.board.devfreq_name
    assert list(dev.knob_values) == EXPECTED_MHZ[board.board.key]
    assert dev.info.backend == "jetson"
    assert dev.info.kind == board.board.kind  # detected from /proc/device-tree/model
    assert dev.info.power_rail == board.board.board_rail
    assert dev.info.memory_bytes == board.board.meminfo_kb * 1024
    assert dev.read_power_w() == pytest.approx(board.board.board_power_w, abs=2e-3)
    assert dev.current_knob_value() == EXPECTED_MHZ[board.board.key][-1]
    assert dev.original_settings.governor == "nvhost_podgov"
    dev.close()


def test_lock_and_restore_round_trip(board: FakeJetson, state_dir: Path):
    first, last = board.board.freqs_hz[0], board.board.freqs_hz[-1]
    dev = open_jetson(board, state_dir)
    target = dev.knob_values[len(dev.knob_values) // 2]
    dev.set_knob_value(target)
    assert board.min_hz == board.max_hz == round(target * 1e6)
    assert dev.locked_gpu_freq_mhz() == target
    saved = json.loads(dev.state_file.read_text())
    assert saved["settings"]["min-freq-hz"] == first
    assert saved["settings"]["max-freq-hz"] == last
    assert saved["pid"] == os.getpid()
    dev.restore()
    assert (board.min_hz, board.max_hz) == (first, last)
    assert not dev.state_file.exists()
    dev.restore()  # idempotent
    assert (board.min_hz, board.max_hz) == (first, last)
    dev.close()


def test_locked_context_restores_on_exception(board: FakeJetson, state_dir: Path):
    dev = open_jetson(board, state_dir)
    with pytest.raises(RuntimeError, match="boom"), locked(dev, dev.knob_values[1]):
        assert board.max_hz == board.board.freqs_hz[1]
        raise RuntimeError("boom")
    assert (board.min_hz, board.max_hz) == (board.board.freqs_hz[0], board.board.freqs_hz[-1])


def kernel_like_writer(log: list[tuple[str, str]]):
    """Writes like the kernel: a limit that would put min above max is refused (EINVAL)."""

    def write(path: Path, value: str) -> None:
        other = path.with_name("max_freq" if path.name == "min_freq" else "min_freq")
        other_hz = int(other.read_text())
        new_min, new_max = (
            (int(value), other_hz) if path.name == "min_freq" else (other_hz, int(value))
        )
        if new_min > new_max:
            raise OSError(errno.EINVAL, "Invalid argument")
        log.append((path.name, value))
        write_sysfs(path, value)

    return write


def test_write_order_keeps_min_below_max(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    writes: list[tuple[str, str]] = []
    dev = open_jetson(fake, state_dir, writer=kernel_like_writer(writes))
    dev.set_knob_value(408.0)  # down from [306, 1020]: min first
    dev.set_knob_value(918.0)  # up from 408: max first
    dev.set_knob_value(510.0)  # down again
    assert (fake.min_hz, fake.max_hz) == (510_000_000, 510_000_000)
    dev.restore()
    assert (fake.min_hz, fake.max_hz) == (306_000_000, 1_020_000_000)
    assert writes[:4] == [
        ("min_freq", "408000000"),
        ("max_freq", "408000000"),
        ("max_freq", "918000000"),
        ("min_freq", "918000000"),
    ]


def test_original_limits_other_than_full_range_come_back(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    fake.set_limits_hz(230_400_000, 614_400_000)  # e.g. an nvpmodel 5 W mode's cap
    dev = open_jetson(fake, state_dir, writer=kernel_like_writer([]))
    dev.set_knob_value(921.6)
    assert fake.min_hz == fake.max_hz == 921_600_000
    dev.close()
    assert (fake.min_hz, fake.max_hz) == (230_400_000, 614_400_000)


def test_frequency_not_in_table_changes_nothing(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    dev = open_jetson(fake, state_dir)
    with pytest.raises(InvalidFrequencyError, match=r"500 MHz is not in .*76\.8"):
        dev.set_knob_value(500.0)
    assert (fake.min_hz, fake.max_hz) == (76_800_000, 921_600_000)
    assert not dev.state_file.exists()


def test_no_write_permission_is_a_clear_error_without_changes(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "xavier-nx-jp5")

    def refuse(path: Path, value: str) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    dev = open_jetson(fake, state_dir, writer=refuse)
    with pytest.raises(DevicePermissionError) as info:
        dev.set_knob_value(510.0)
    msg = str(info.value)
    assert "min_freq" in msg and "root" in msg and "udev" in msg and "17000000.gv11b" in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert (fake.min_hz, fake.max_hz) == (114_750_000, 1_109_250_000)
    assert not dev.state_file.exists()  # nothing was changed, nothing to restore later
    dev.close()


def test_read_only_limits_fail_before_any_write(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    writes: list[tuple[str, str]] = []
    dev = open_jetson(fake, state_dir, writer=kernel_like_writer(writes))
    real_access = os.access
    monkeypatch.setattr(
        jetson_sysfs.os,
        "access",
        lambda p, mode: False if mode == os.W_OK else real_access(p, mode),
    )
    with pytest.raises(DevicePermissionError, match="SuperNode as root"):
        dev.set_knob_value(612.0)
    assert writes == []
    assert not dev.state_file.exists()


def test_kernel_capping_below_the_request_is_a_warning(
    tmp_path: Path, state_dir: Path, caplog: pytest.LogCaptureFixture
):
    fake = build_tree(tmp_path / "root", "tx2-jp4")
    fake.set_limits_hz(140_250_000, 1_122_000_000)

    def capped(path: Path, value: str) -> None:  # e.g. a thermal limit at 1122 MHz
        if path.name == "max_freq":
            value = str(min(int(value), 1_122_000_000))
        write_sysfs(path, value)

    dev = open_jetson(fake, state_dir, writer=capped)
    dev.set_knob_value(1300.5)  # slower than asked is safe for the cap
    assert "thermal" in caplog.text
    dev.close()
    assert (fake.min_hz, fake.max_hz) == (140_250_000, 1_122_000_000)
    assert not dev.state_file.exists()


def test_lock_that_does_not_hold_is_an_error_and_restored(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "tx2-jp4")

    def ignores_max(path: Path, value: str) -> None:
        if path.name != "max_freq":
            write_sysfs(path, value)

    dev = open_jetson(fake, state_dir, writer=ignores_max)
    with pytest.raises(DeviceError, match="the lock did not hold"):
        dev.set_knob_value(408.0)
    assert (fake.min_hz, fake.max_hz) == (140_250_000, 1_300_500_000)
    assert not dev.state_file.exists()


def test_power_rails_can_be_chosen(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    dev = open_jetson(fake, state_dir, power_rails=["VDD_CPU_GPU_CV"])
    assert dev.info.power_rail == "VDD_CPU_GPU_CV"
    assert dev.read_power_w() == pytest.approx(5.032 * 0.640)
    with pytest.raises(DeviceError, match=r"VDD_GPU.*available rails: VDD_IN"):
        open_jetson(fake, state_dir, power_rails=["VDD_GPU"])


def test_not_a_jetson_is_unavailable(tmp_path: Path, state_dir: Path):
    (tmp_path / "sys" / "class" / "devfreq").mkdir(parents=True)
    with pytest.raises(DeviceUnavailableError, match="no GPU devfreq node"):
        JetsonDevice("", root=tmp_path, sampled=SampledOptions(state_dir=state_dir))


def test_known_node_name_found_without_of_node(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    (fake.root / "sys/devices/57000000.gpu/of_node").unlink()
    assert find_gpu_devfreq(fake.root) == fake.class_node


def test_no_power_monitor_and_no_jtop(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "jtop", None)
    fake = build_tree(tmp_path / "root", "nano-jp4", with_power=False)
    with pytest.raises(DeviceUnavailableError, match=r"no INA3221.*pip install jetson-stats"):
        open_jetson(fake, state_dir)


class FakeJtop:
    running = True

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.power = {
            "rail": {"VDD_CPU_GPU_CV": {"power": 2100, "avg": 2000}},
            "tot": {"power": 7250, "avg": 7000, "name": "VDD_IN"},
        }
        self.closed = False

    def start(self) -> None:
        if not self.running:
            raise RuntimeError("The jtop.service is not active")

    def close(self) -> None:
        self.closed = True


def test_jtop_reads_power_when_sysfs_has_none(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "jtop", types.SimpleNamespace(jtop=FakeJtop))
    fake = build_tree(tmp_path / "root", "orin-nano-jp6", with_power=False)
    dev = open_jetson(fake, state_dir)
    assert dev.info.power_rail == "jtop:VDD_IN"
    assert dev.read_power_w() == pytest.approx(7.25)
    dev.set_knob_value(714.0)  # the frequency still goes through devfreq
    assert fake.max_hz == 714_000_000
    dev.close()
    assert fake.max_hz == 1_020_000_000


def test_jtop_service_down_says_how_to_start_it(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    down = type("DownJtop", (FakeJtop,), {"running": False})
    monkeypatch.setitem(sys.modules, "jtop", types.SimpleNamespace(jtop=down))
    fake = build_tree(tmp_path / "root", "nano-jp4", with_power=False)
    with pytest.raises(DeviceUnavailableError, match=r"systemctl restart jtop"):
        open_jetson(fake, state_dir, power_source="jtop")


def test_meter_accounts_wall_time_and_sampled_energy(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    dev = open_jetson(fake, state_dir, sample_rate_hz=200.0)
    calls = []

    def work() -> None:
        calls.append(1)
        time.sleep(0.02)

    with dev.measure(WORKLOAD) as meter:
        for _ in range(3):
            meter.step(16, work)
    m = meter.measurement
    assert isinstance(m, PowerMeasurement)
    assert len(calls) == 3 and m.steps == 3 and m.samples == 48
    assert 0.06 <= m.time_s < 1.0
    # constant board power: energy = P × t whatever the sample times
    assert m.energy_j == pytest.approx(8.1144 * m.time_s, rel=1e-9)
    assert m.peak_power_w == pytest.approx(8.1144)
    assert m.power_rail == "VDD_IN" and m.cap_violations == 0


def test_cap_guard_steps_frequency_down(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")  # board draws 8.11 W
    dev = open_jetson(fake, state_dir, sample_rate_hz=100.0)
    with locked(dev, 918.0), dev.cap_guard(7.0, window_s=0.0), dev.measure(WORKLOAD) as meter:
        meter.step(8, lambda: time.sleep(0.05))
        assert dev.locked_gpu_freq_mhz() is not None
        assert dev.locked_gpu_freq_mhz() < 918.0  # type: ignore[operator]
    m = meter.measurement
    assert isinstance(m, PowerMeasurement)
    assert m.cap_violations >= 1
    assert m.time_over_cap_s > 0.0
    assert (fake.min_hz, fake.max_hz) == (306_000_000, 1_020_000_000)  # restored


def test_profiling_is_never_guarded(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    dev = open_jetson(fake, state_dir, sample_rate_hz=100.0, cap_window_s=0.0)
    with locked(dev, 918.0), dev.measure(WORKLOAD) as meter:
        meter.step(8, lambda: time.sleep(0.03))
        assert dev.locked_gpu_freq_mhz() == 918.0
    m = meter.measurement
    assert isinstance(m, PowerMeasurement) and m.cap_violations == 0


def test_leftover_state_of_a_dead_process_is_restored_at_open(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "tx2-jp4")
    dev = open_jetson(fake, state_dir)
    dev.set_knob_value(408.0)
    # pretend the process that locked it died without restoring
    code = "import os; print(os.getpid())"
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    data = json.loads(dev.state_file.read_text())
    data["pid"] = int(dead.stdout)
    dev.state_file.write_text(json.dumps(data))
    again = open_jetson(fake, state_dir)
    assert (fake.min_hz, fake.max_hz) == (140_250_000, 1_300_500_000)
    assert not again.state_file.exists()
    assert again.original_settings.max_freq_hz == 1_300_500_000


def test_state_held_by_a_live_process_refuses_to_open(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    dev = open_jetson(fake, state_dir)
    dev.set_knob_value(307.2)
    data = json.loads(dev.state_file.read_text())
    data["pid"] = os.getppid()  # alive, not us
    dev.state_file.write_text(json.dumps(data))
    with pytest.raises(DeviceError, match=f"process {os.getppid()} holds"):
        open_jetson(fake, state_dir)
    dev.close()


def test_second_instance_in_same_process_keeps_true_originals(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    a = open_jetson(fake, state_dir)
    a.set_knob_value(307.2)
    b = open_jetson(fake, state_dir)
    assert b.original_settings.max_freq_hz == 921_600_000
    b.close()
    a.close()
    assert (fake.min_hz, fake.max_hz) == (76_800_000, 921_600_000)


@pytest.mark.hardware
def test_real_jetson_round_trip():
    """On a Jetson, as root: lock the lowest frequency and restore."""
    if find_gpu_devfreq("/") is None:
        pytest.skip("not a Jetson")
    if os.geteuid() != 0:
        pytest.skip("needs root")
    dev = JetsonDevice("")
    before = dev.original_settings
    with locked(dev, dev.knob_values[0]):
        assert dev.locked_gpu_freq_mhz() == dev.knob_values[0]
    after = jetson_sysfs.DevfreqGpu(dev.devfreq_node).read_settings()
    assert (after.min_freq_hz, after.max_freq_hz) == (before.min_freq_hz, before.max_freq_hz)
    dev.close()


# ----------------------------------------------------------------- issue 12 §6: Jetson paths


def test_sysfs_root_may_be_the_sysfs_mount_itself(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    mount = fake.root / "sys"
    assert jetson_sysfs.sysfs_root(mount).sys == mount
    assert jetson_sysfs.sysfs_root(mount).proc == fake.root / "proc"
    assert jetson_sysfs.sysfs_root(fake.root).sys == mount
    assert find_gpu_devfreq(mount) == fake.class_node
    dev = JetsonDevice("", root=mount, sampled=SampledOptions(state_dir=state_dir))
    assert dev.info.kind == "jetson-orin-nano"  # /proc found next to the mount
    assert dev.info.memory_bytes == fake.board.meminfo_kb * 1024
    assert dev.info.power_rail == "VDD_IN"
    dev.set_knob_value(612.0)
    assert fake.max_hz == 612_000_000
    dev.close()
    assert fake.max_hz == 1_020_000_000


def test_wrong_sysfs_root_names_the_path_and_both_forms(tmp_path: Path, state_dir: Path):
    with pytest.raises(DeviceUnavailableError) as info:
        JetsonDevice("", root=tmp_path / "nowhere", sampled=SampledOptions(state_dir=state_dir))
    msg = str(info.value)
    assert f"{tmp_path / 'nowhere' / 'sys' / 'class' / 'devfreq'} does not exist" in msg
    assert "sysfs mount itself" in msg and "sys/sys" not in msg


def hwmon_dir(fake: FakeJetson) -> Path:
    chip = fake.board.chips[0]
    return fake.root / "sys" / "bus" / "i2c" / "devices" / chip.bus_addr / chip.folder


def test_chip_without_readable_channels_says_what_is_missing(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "jtop", None)
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    folder = hwmon_dir(fake)
    (folder / "curr1_input").unlink()  # VDD_IN: no current file
    (folder / "curr2_input").unlink()
    (folder / "in3_input").unlink()  # VDD_SOC: no voltage file
    with pytest.raises(DeviceUnavailableError) as info:
        open_jetson(fake, state_dir)
    msg = str(info.value)
    assert "no INA3221 under" not in msg
    assert "INA3221 chip(s) 1-0040" in msg
    assert "VDD_IN: curr1_input missing" in msg and "VDD_SOC: in3_input missing" in msg


def test_unreadable_channel_is_named(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "orin-nano-jp6")
    folder = hwmon_dir(fake)
    (folder / "curr3_input").unlink()
    (folder / "curr3_input").mkdir()  # reading it fails like an unreadable file
    scan = jetson_power.scan_ina3221(fake.root)
    assert [r.name for r in scan.rails] == ["VDD_IN", "VDD_CPU_GPU_CV"]
    assert any("VDD_SOC" in p and "curr3_input" in p for p in scan.problems)
    with pytest.raises(DeviceError, match=r"VDD_SOC not found.*unreadable: VDD_SOC: .*curr3"):
        open_jetson(fake, state_dir, power_rails=["VDD_SOC"])


def test_garbage_in_sysfs_names_the_file(tmp_path: Path, state_dir: Path):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    dev = open_jetson(fake, state_dir)
    (fake.node / "cur_freq").write_text("busy\n")
    with pytest.raises(ValueError, match=r"cur_freq: expected an integer, got 'busy'"):
        dev.current_knob_value()
    dev.close()
    (fake.node / "available_frequencies").write_text("76800000 oops\n")
    with pytest.raises(jetson_sysfs.SysfsFormatError, match="available_frequencies: expected"):
        open_jetson(fake, state_dir)


def test_garbage_in_a_rail_names_the_file(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "jtop", None)
    fake = build_tree(tmp_path / "root", "nano-jp4")
    chip = fake.root / "sys" / "bus" / "i2c" / "devices" / "6-0040" / "iio:device0"
    for n in range(3):
        (chip / f"in_power{n}_input").write_text("n/a\n")
    with pytest.raises(DeviceUnavailableError, match=r"in_power0_input: expected an integer"):
        open_jetson(fake, state_dir)


def test_jtop_can_sum_chosen_rails(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "jtop", types.SimpleNamespace(jtop=FakeJtop))
    fake = build_tree(tmp_path / "root", "orin-nano-jp6", with_power=False)
    dev = open_jetson(fake, state_dir, power_rails=["VDD_CPU_GPU_CV"])
    assert dev.info.power_rail == "jtop:VDD_CPU_GPU_CV"
    assert dev.read_power_w() == pytest.approx(2.1)
    dev.close()
    with pytest.raises(DeviceError, match=r"VDD_GPU not found in jtop.*VDD_CPU_GPU_CV"):
        open_jetson(fake, state_dir, power_rails=["VDD_GPU"])


def test_b1_bands_come_from_the_boards_descriptor(tmp_path: Path, state_dir: Path):
    nano = open_jetson(build_tree(tmp_path / "nano", "nano-jp4"), state_dir)
    assert [b.freq_mhz for b in nano.info.b1_bands] == [307.2, 614.4, 921.6]
    assert nano.info.b1_max_knob_value(4.5) == 307.2
    assert nano.info.b1_max_knob_value(math.inf) == 921.6
    with pytest.raises(ValueError, match="below the lowest B1 band of jetson-nano"):
        nano.info.b1_max_knob_value(3.0)
    nano.close()
    orin = open_jetson(build_tree(tmp_path / "orin", "agx-orin-jp5"), state_dir)
    assert orin.info.b1_max_knob_value(30.0) == 726.75
    orin.close()


def test_board_without_descriptor_has_no_b1_bands(
    tmp_path: Path,
    state_dir: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(base, "_NO_BANDS_LOGGED", set())
    dev = JetsonDevice(
        "",
        root=build_tree(tmp_path / "r", "tx2-jp4").root,
        sampled=SampledOptions(state_dir=state_dir),
    )
    assert dev.info.kind == "jetson-tx2" and dev.info.b1_bands == ()
    assert dev.info.b1_max_knob_value(5.0) == 1300.5
    assert dev.info.b1_max_knob_value(math.inf) == 1300.5
    assert caplog.text.count("no frequency bands known for jetson-tx2") == 1
    dev.close()


def test_the_power_sensor_says_what_a_profiled_cell_needs(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    # INA3221 over sysfs: the board's descriptor numbers, at this device's sampling rate
    nano = open_jetson(build_tree(tmp_path / "nano", "nano-jp4"), state_dir)
    assert nano.info.sensor.name == "ina3221-sysfs"
    assert (nano.info.sensor.min_window_s, nano.info.sensor.min_power_samples) == (0.5, 10)
    assert nano.info.board_sensor is None  # the real board: nothing to report
    assert "0.5 s" in nano.describe()["power-sensor"]
    nano.close()
    slow = open_jetson(build_tree(tmp_path / "slow", "nano-jp4"), state_dir, sample_rate_hz=1.0)
    assert slow.info.sensor.min_window_s == pytest.approx(10.0)  # 10 samples at 1 Hz
    slow.close()
    # a board without a descriptor: the INA3221 defaults
    tx2 = JetsonDevice(
        "",
        root=build_tree(tmp_path / "r", "tx2-jp4").root,
        sampled=SampledOptions(state_dir=state_dir),
    )
    assert tx2.info.sensor.name == "ina3221-sysfs" and tx2.info.sensor.min_window_s == 0.5
    tx2.close()
    # jtop: readings change once per the service's interval (its own, not the one asked for)
    monkeypatch.setitem(sys.modules, "jtop", types.SimpleNamespace(jtop=FakeJtop))
    dev = open_jetson(build_tree(tmp_path / "jtop", "orin-nano-jp6", with_power=False), state_dir)
    assert dev.info.sensor.name == "jtop" and dev.info.sensor.update_period_s == 0.1
    assert dev.info.sensor.min_window_s == pytest.approx(0.5)  # 5 readings, 0.5 s floor
    dev.close()

    class SlowJtop(FakeJtop):  # another client started the service at 1 s
        def __init__(self, interval: float = 1.0) -> None:
            super().__init__(interval)
            self.interval = 1.0

    slow_service = SlowJtop
    monkeypatch.setitem(sys.modules, "jtop", types.SimpleNamespace(jtop=slow_service))
    dev = open_jetson(build_tree(tmp_path / "jtop1", "orin-nano-jp6", with_power=False), state_dir)
    assert dev.info.sensor.update_period_s == 1.0 and dev.info.sensor.min_window_s == 5.0
    dev.close()
