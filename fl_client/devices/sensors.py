"""What each backend's power sensor needs per profiled cell: a window and a sample minimum.

A profiled cell must be measured long enough for its power sensor: long enough to hold
``min_power_samples`` readings that are not repeats of one another, and never shorter than
a floor that covers the GPU settling after a frequency change. ``SensorSpec`` (in
``base``) carries the numbers; this module makes them per backend, with their sources:

========================  ==========  ===========  ====================================
sensor                    update      samples      window at the default 20 Hz sampler
========================  ==========  ===========  ====================================
INA3221 over sysfs        6.6 ms      10           max(0.5 s, 10 × 50 ms) = 0.5 s
jtop (jetson-stats)       1 s         5            5 × 1 s = 5 s (its interval, default 1 s)
NVML instantaneous field  100 ms      10           10 × 100 ms = 1 s
NVML default reading      1 s (avg)   5            5 × 1 s = 5 s
replay table, twin        per step    1            none (one exact value per step)
========================  ==========  ===========  ====================================

The window is ``max(floor, samples × max(update period, 1 / sample rate))``: readings taken
faster than the sensor updates repeat it, readings taken slower than the sampler's rate do
not exist. ``configs/devices/<kind>.toml`` ``[sensor]`` may override the INA3221
numbers of a board (``update-period-s``, ``min-power-samples``, ``min-window-s``).

Sources
-------
* INA3221: Linux ``Documentation/hwmon/ina3221.rst`` (``update_interval = C × S × (BC +
  SC)``: channels × averaged samples × bus + shunt conversion times) with the chip's
  reset configuration 0x7127 (TI INA3221 datasheet SBOS576, configuration register: 1
  sample, 1.1 ms bus and 1.1 ms shunt conversion, 3 channels): 3 × 1 × 2.2 ms = 6.6 ms.
  A device tree that programs more averaging updates less often: override it.
* jtop: jetson-stats ``jtop(interval=1.0)``; the service runs at the interval of the first
  client connected, which ``jtop.interval`` reports (the backend reads it).
* NVML: ``nvmlDeviceGetPowerUsage`` "On Ampere (except GA100) or newer GPUs, the API
  returns power averaged over 1 sec interval" (NVML API reference); the instantaneous field
  ``NVML_FI_DEV_POWER_INSTANT`` updates about every 100 ms on A100/H100 (Yang, Adamek,
  Armour, "Accurate and Convenient Energy Measurements for GPUs", SC'24, which also finds
  it sees only part of each period: a reason for 10 samples, not 2).
* Floor of 0.5 s on real sensors: a DVFS change settles in milliseconds, but clocks, fans
  and the rail's capacitors take some hundred ms; 0.5 s is also 10 samples of the default
  20 Hz sampler (``sampler.DEFAULT_SAMPLE_RATE_HZ``), which catches peaks the paper's
  1 Hz missed.
* Sample minimums: 10 readings of an instantaneous sensor give a cell's average power to
  ±σ/√10 and a peak from more than a couple of readings; an averaging sensor's readings
  overlap, so 5 of them (4 that start after the warm-up's) are the least that describe a
  cell rather than the transition into it.
"""

from __future__ import annotations

import math

from fl_client.devices.base import EXACT_SENSOR, SensorSpec
from fl_client.devices.sampler import DEFAULT_SAMPLE_RATE_HZ

#: INA3221 at its reset configuration: 3 channels × 1 sample × (1.1 + 1.1) ms.
INA3221_UPDATE_PERIOD_S = 3 * 1 * (1.1e-3 + 1.1e-3)
#: Readings per cell from an instantaneous sensor (INA3221, NVML's instantaneous field).
INSTANT_MIN_POWER_SAMPLES = 10
#: Readings per cell from an averaging sensor (jtop's interval, NVML's 1 s average).
AVERAGING_MIN_POWER_SAMPLES = 5
#: The least window of a cell on a real sensor.
REAL_MIN_WINDOW_S = 0.5
#: jetson-stats' default jtop interval.
JTOP_DEFAULT_INTERVAL_S = 1.0
#: NVML's default power reading: an average over about a second (Ampere and newer).
NVML_AVERAGE_PERIOD_S = 1.0
#: NVML's instantaneous power field: updated about every 100 ms.
NVML_INSTANT_PERIOD_S = 0.1

INA3221_SOURCE = (
    "INA3221 reset config 0x7127: 3 channels x 1 sample x 2.2 ms = 6.6 ms per update "
    "(Linux hwmon ina3221 docs, TI SBOS576)"
)
REPLAY_SENSOR = SensorSpec(
    "replay-table",
    0.0,
    1,
    0.0,
    "the table's own: each row is already one measured value per (b, knob), averaged over "
    "the window it was measured in",
)
TWIN_SENSOR = SensorSpec("twin", 0.0, 1, 0.0, "one modelled reading per step on the emulated clock")


def sampled_window_s(
    min_power_samples: int, update_period_s: float, sample_rate_hz: float, floor_s: float
) -> float:
    """The least window holding ``min_power_samples`` distinct readings of a sensor that
    updates every ``update_period_s``, sampled at ``sample_rate_hz``; at least ``floor_s``."""
    period_s = max(update_period_s, 1.0 / sample_rate_hz)
    return max(floor_s, min_power_samples * period_s)


def ina3221_sensor(
    sample_rate_hz: float = DEFAULT_SAMPLE_RATE_HZ,
    *,
    update_period_s: float = INA3221_UPDATE_PERIOD_S,
    min_power_samples: int = INSTANT_MIN_POWER_SAMPLES,
    min_window_s: float = REAL_MIN_WINDOW_S,
    source: str = INA3221_SOURCE,
) -> SensorSpec:
    """The board's INA3221 read over sysfs at ``sample_rate_hz`` (``min_window_s`` is the
    floor; the window also spans ``min_power_samples`` distinct readings)."""
    return SensorSpec(
        "ina3221-sysfs",
        sampled_window_s(min_power_samples, update_period_s, sample_rate_hz, min_window_s),
        min_power_samples,
        update_period_s,
        source,
    )


def jtop_sensor(
    interval_s: float | None, sample_rate_hz: float = DEFAULT_SAMPLE_RATE_HZ
) -> SensorSpec:
    """jtop's readings, which change once per its service's interval (None or not a
    positive number: jetson-stats' default, 1 s)."""
    ok = isinstance(interval_s, int | float) and math.isfinite(interval_s) and interval_s > 0
    period_s = float(interval_s) if ok and interval_s is not None else JTOP_DEFAULT_INTERVAL_S
    return SensorSpec(
        "jtop",
        sampled_window_s(AVERAGING_MIN_POWER_SAMPLES, period_s, sample_rate_hz, REAL_MIN_WINDOW_S),
        AVERAGING_MIN_POWER_SAMPLES,
        period_s,
        f"jtop service interval {period_s:g} s (jetson-stats default 1 s)",
    )


def nvml_sensor(reading: str, sample_rate_hz: float = DEFAULT_SAMPLE_RATE_HZ) -> SensorSpec:
    """NVML power: ``instant`` (the instantaneous field, ~100 ms) or ``average`` (the
    default reading, a ~1 s average on Ampere and newer)."""
    if reading == "instant":
        n, period_s = INSTANT_MIN_POWER_SAMPLES, NVML_INSTANT_PERIOD_S
        source = "NVML_FI_DEV_POWER_INSTANT, updated about every 100 ms (Yang et al., SC'24)"
    else:
        n, period_s = AVERAGING_MIN_POWER_SAMPLES, NVML_AVERAGE_PERIOD_S
        source = "nvmlDeviceGetPowerUsage, averaged over 1 s on Ampere and newer (NVML docs)"
    return SensorSpec(
        f"nvml-{reading}",
        sampled_window_s(n, period_s, sample_rate_hz, REAL_MIN_WINDOW_S),
        n,
        period_s,
        source,
    )


__all__ = [
    "AVERAGING_MIN_POWER_SAMPLES",
    "EXACT_SENSOR",
    "INA3221_UPDATE_PERIOD_S",
    "INSTANT_MIN_POWER_SAMPLES",
    "JTOP_DEFAULT_INTERVAL_S",
    "NVML_AVERAGE_PERIOD_S",
    "NVML_INSTANT_PERIOD_S",
    "REAL_MIN_WINDOW_S",
    "REPLAY_SENSOR",
    "TWIN_SENSOR",
    "SensorSpec",
    "ina3221_sensor",
    "jtop_sensor",
    "nvml_sensor",
    "sampled_window_s",
]
