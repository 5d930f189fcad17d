"""fl_client.devices.sensors: what each backend's power sensor needs per profiled cell."""

from __future__ import annotations

import math

import pytest

from fl_client.devices.base import EXACT_SENSOR, SensorSpec
from fl_client.devices.replay import ReplayDevice
from fl_client.devices.sampler import DEFAULT_SAMPLE_RATE_HZ
from fl_client.devices.sensors import (
    INA3221_UPDATE_PERIOD_S,
    REPLAY_SENSOR,
    ina3221_sensor,
    jtop_sensor,
    nvml_sensor,
    sampled_window_s,
)
from tests.fl_client.devices.test_replay import EXAMPLE


def test_each_backends_window_and_sample_minimum() -> None:
    assert DEFAULT_SAMPLE_RATE_HZ == 20.0
    ina = ina3221_sensor()
    assert ina.update_period_s == pytest.approx(0.0066)  # 3 channels x 1 x (1.1 + 1.1) ms
    assert (ina.min_window_s, ina.min_power_samples) == (0.5, 10)
    assert ina3221_sensor(200.0).min_window_s == 0.5  # the floor
    assert ina3221_sensor(1.0).min_window_s == 10.0  # 10 samples at 1 Hz
    assert jtop_sensor(1.0).min_window_s == 5.0 and jtop_sensor(1.0).min_power_samples == 5
    assert jtop_sensor(None).update_period_s == 1.0  # jetson-stats' default interval
    assert jtop_sensor(0.1).min_window_s == 0.5
    assert nvml_sensor("instant").min_window_s == 1.0
    assert nvml_sensor("average").min_window_s == 5.0
    # every real sensor's window spans its sample minimum in distinct readings
    real = [(ina, 20.0), (ina3221_sensor(1.0), 1.0), (jtop_sensor(1.0), 20.0)]
    real += [(nvml_sensor("instant"), 20.0), (nvml_sensor("average"), 20.0)]
    for sensor, rate_hz in real:
        period_s = max(sensor.update_period_s, 1 / rate_hz)
        assert sensor.min_window_s >= sensor.min_power_samples * period_s - 1e-12
        assert sensor.source
    assert sampled_window_s(10, INA3221_UPDATE_PERIOD_S, 1000.0, 0.0) == pytest.approx(0.066)


def test_emulated_sensors_need_no_window() -> None:
    for sensor in (EXACT_SENSOR, REPLAY_SENSOR):
        assert (sensor.min_window_s, sensor.min_power_samples) == (0.0, 1)
        assert "no window needed" in sensor.label
    replay = ReplayDevice.from_file(EXAMPLE)
    assert replay.info.sensor == REPLAY_SENSOR
    # a table of a board with a descriptor reports what that board would have needed
    board = replay.info.board_sensor
    assert board is not None and board.name == "ina3221-sysfs" and board.min_window_s == 0.5


def test_window_for_counts_whole_steps() -> None:
    spec = SensorSpec("s", min_window_s=0.5, min_power_samples=10)
    assert spec.window_for(0.02, 3) == pytest.approx(0.5)  # 25 steps
    assert spec.window_for(0.03, 3) == pytest.approx(0.51)  # 17 steps
    assert spec.window_for(0.4, 3) == pytest.approx(1.2)  # the 3 measured already cover it
    assert math.isnan(spec.window_for(0.0, 3))
    assert "≥ 0.5 s and ≥ 10 power samples" in spec.label


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"min_window_s": -1.0}, "min-window-s"),
        ({"min_window_s": math.inf}, "min-window-s"),
        ({"update_period_s": math.nan}, "update-period-s"),
        ({"min_power_samples": 0}, "min-power-samples"),
        ({"min_power_samples": 2.0}, "min-power-samples"),
    ],
)
def test_bad_sensor_numbers_name_the_key(kw: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SensorSpec("bad", **kw)  # type: ignore[arg-type]
