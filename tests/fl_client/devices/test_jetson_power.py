"""Jetson board power on fake sysfs trees: INA3221 discovery (iio and hwmon), rails, and what
kept a chip's channels out."""

from __future__ import annotations

from pathlib import Path

import pytest

from fl_client.devices import jetson_power
from fl_client.devices.jetson_power import Ina3221Monitor, find_power_rails
from tests.fl_client.devices.fakes_sysfs import build_tree


def test_power_rails_skip_nc_and_shunt_sum(tmp_path: Path):
    fake = build_tree(tmp_path / "root", "agx-orin-jp5")
    names = [r.name for r in find_power_rails(fake.root)]
    assert names == ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"]
    monitor = Ina3221Monitor.discover(fake.root)
    assert monitor is not None
    # hwmon: mV × mA → W
    assert monitor.read_rails_w()["VDD_GPU_SOC"] == pytest.approx(19.968 * 0.520)
    fake.set_channel("VDD_GPU_SOC", 19_968, 1_000)
    assert monitor.read_power_w() == pytest.approx(
        19.968 * 1.0 + 19.968 * 0.18 + 4.984 * 0.72 + 4.992 * 0.15
    )


def test_iio_rails_read_milliwatts(tmp_path: Path):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    fake.set_channel("POM_5V_IN", 5_000, 1_000)
    monitor = Ina3221Monitor.discover(fake.root)
    assert monitor is not None and monitor.rail_label == "POM_5V_IN"
    assert monitor.read_power_w() == pytest.approx(5.0)
    assert set(monitor.read_rails_w()) == {"POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"}


def test_chip_without_channel_folders_says_driver_not_bound(tmp_path: Path):
    fake = build_tree(tmp_path / "root", "nano-jp4")
    chip = fake.root / "sys" / "bus" / "i2c" / "devices" / "6-0040"
    for path in sorted((chip / "iio:device0").iterdir()):
        path.unlink()
    (chip / "iio:device0").rmdir()
    scan = jetson_power.scan_ina3221(fake.root)
    assert scan.rails == [] and scan.chips == ["6-0040"]
    assert "no iio:deviceN or hwmon/hwmonN folder" in scan.why_none()


def test_no_chip_at_all_is_still_no_ina3221(tmp_path: Path):
    fake = build_tree(tmp_path / "root", "nano-jp4", with_power=False)
    assert "no INA3221 under" in jetson_power.scan_ina3221(fake.root).why_none()
