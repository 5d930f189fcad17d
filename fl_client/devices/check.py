"""``powerfl devices --check``: a power-sensor self-test for a new board or GPU.

It runs a few seconds of a known load (a training step the caller builds: this package
knows nothing of models), measure only (no clock or power limit is changed), sampling
faster than the profiler does, and reports what the readings show:

* the sensor's observed update period: the median time between changes of the reading
  (sampling faster than it only repeats values);
* sampled vs counter energy over the same window, where the device has an energy counter;
* the peak/average ratio of the power readings;
* the clock sampled during the load (median, lowest, highest);
* a verdict: whether this sensor can enforce a cap, and the margin below the cap that its
  readings need (``verdict``).

What it cannot prove: that the sensor measures the rail the cap is about (compare with an
external meter once), or how it behaves at other loads and temperatures.

An emulated backend has no sensor to test (``check_emulated``): the digital twin's readings
are its power model's figures and a replay's are its table's cells, one per step on an
emulated clock. There the check runs no step on the host (it would time the host, not the
device), reports the figures the backend gives for the load and says what it cannot tell:
nothing about a real sensor, and, on a replay, nothing about enforcing a cap.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fl_client.devices.base import Device, DeviceError, Workload
from fl_client.devices.emulated import EmulatedDevice

#: The sampling rate of the check: fast enough to see a 100 ms sensor update several times.
CHECK_SAMPLE_RATE_HZ = 50.0
#: Seconds of warm-up steps before the measured window.
CHECK_WARMUP_S = 1.0
#: A sensor that updates at most this often lets the cap guard see over-cap readings within
#: its 1 s window a few times over.
ENFORCING_UPDATE_S = 0.25
#: The least margin below a cap any sensor needs (reading noise, rounding).
MIN_MARGIN_PCT = 2.0
#: A sampled vs counter disagreement above this says the power readings are biased.
MAX_COUNTER_DIFF_PCT = 5.0


#: The most modelled steps ``check_emulated`` accounts (each costs no host time).
EMULATED_MAX_STEPS = 10_000


class SensorCheckError(DeviceError):
    """The device has no usable power readings (none, failing or stuck)."""


@dataclass(frozen=True)
class SensorCheck:
    """What ``check_sensor`` saw (kebab-case keys in ``to_dict``)."""

    device: str
    sensor: str
    window_s: float
    steps: int
    power_samples: int
    sample_interval_s: float
    update_period_s: float  # NaN: the reading changed at every sample (faster than sampled)
    sampled_energy_j: float
    counter_energy_j: float | None
    counter_diff_pct: float | None
    avg_power_w: float
    peak_power_w: float
    clock_mhz: float
    clock_min_mhz: float
    clock_max_mhz: float
    can_enforce_cap: bool
    margin_pct: float
    verdict: str

    @property
    def peak_to_avg(self) -> float:
        return self.peak_power_w / self.avg_power_w if self.avg_power_w > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "sensor": self.sensor,
            "window-s": self.window_s,
            "steps": self.steps,
            "power-samples": self.power_samples,
            "sample-interval-s": self.sample_interval_s,
            "update-period-s": self.update_period_s,
            "sampled-energy-j": self.sampled_energy_j,
            "counter-energy-j": self.counter_energy_j,
            "counter-diff-pct": self.counter_diff_pct,
            "avg-power-w": self.avg_power_w,
            "peak-power-w": self.peak_power_w,
            "peak-to-avg": self.peak_to_avg,
            "clock-mhz": self.clock_mhz,
            "clock-min-mhz": self.clock_min_mhz,
            "clock-max-mhz": self.clock_max_mhz,
            "can-enforce-cap": self.can_enforce_cap,
            "margin-pct": self.margin_pct,
            "verdict": self.verdict,
        }


def update_period_s(times_s: Sequence[float], powers_w: Sequence[float]) -> float:
    """The median time between changes of a sampled reading; NaN when it changed at (almost)
    every sample (the sensor updates at least as often as it was sampled) or never."""
    changes = [times_s[i] for i in range(1, len(powers_w)) if powers_w[i] != powers_w[i - 1]]
    if len(changes) < 3 or len(changes) >= 0.9 * (len(powers_w) - 1):
        return math.nan
    return float(statistics.median(b - a for a, b in itertools.pairwise(changes)))


def verdict(
    update_s: float, sample_interval_s: float, counter_diff_pct: float | None, peak_to_avg: float
) -> tuple[bool, float, str]:
    """Whether a sensor can enforce a cap and the margin below the cap it needs (%).

    A reading that updates every ``ENFORCING_UPDATE_S`` or faster shows the guard each
    over-cap stretch of one update or more; its margin is its disagreement with the energy
    counter (a bias of the power reading), at least ``MIN_MARGIN_PCT``. A slower (averaging)
    sensor smooths the peaks a cap is about: it needs the observed peak/average ratio as
    margin on top, and it cannot stop short peaks; a power reading more than
    ``MAX_COUNTER_DIFF_PCT`` off its own counter is not trusted.
    """
    period_s = update_s if math.isfinite(update_s) else sample_interval_s
    bias_pct = abs(counter_diff_pct) if counter_diff_pct is not None else 0.0
    margin = max(MIN_MARGIN_PCT, bias_pct)
    if counter_diff_pct is not None and bias_pct > MAX_COUNTER_DIFF_PCT:
        return (
            False,
            margin,
            f"no: the power readings are {counter_diff_pct:+.1f}% off the energy counter "
            f"(> {MAX_COUNTER_DIFF_PCT:g}%); check which rail they measure",
        )
    if period_s <= ENFORCING_UPDATE_S:
        return (
            True,
            margin,
            f"yes: readings update every {period_s:.3g} s, so the cap guard sees every "
            f"over-cap stretch of {period_s:.3g} s or more; keep P_max at least "
            f"{margin:.1f}% above the profiled peaks (cap-margin {margin / 100:.2f})",
        )
    margin += 100.0 * max(peak_to_avg - 1.0, 0.0)
    return (
        False,
        margin,
        f"only on average: readings update every {period_s:.3g} s and smooth shorter peaks; "
        f"a cap needs a margin of at least {margin:.1f}% and still misses short peaks",
    )


def check_sensor(
    device: Device,
    workload: Workload,
    batch_size: int,
    step: Callable[[], object],
    *,
    seconds: float = 5.0,
    warmup_s: float = CHECK_WARMUP_S,
) -> SensorCheck:
    """Run ``step`` (the known load) for ``warmup_s`` then ``seconds`` of device time in one
    measurement, measure only, and judge the readings (module docstring).

    Raises SensorCheckError when the device gives no power readings, they fail, or they do
    not change at all during the load.
    """
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds: must be a number of seconds > 0, got {seconds!r}")
    rate = getattr(device, "sample_rate_hz", None)
    if isinstance(rate, float) and rate < CHECK_SAMPLE_RATE_HZ:
        device.sample_rate_hz = CHECK_SAMPLE_RATE_HZ  # type: ignore[attr-defined]
    try:
        with device.measure(workload) as meter:
            while meter.time_s < warmup_s:
                meter.step(batch_size, step)
        with device.measure(workload) as meter:
            while meter.time_s < seconds:
                meter.step(batch_size, step)
    finally:
        if isinstance(rate, float):
            device.sample_rate_hz = rate  # type: ignore[attr-defined]
    m = meter.measurement
    name = f"{device.info.kind} ({device.info.backend})"
    powers = list(m.power_samples_w)
    errors = getattr(m, "read_errors", 0)
    if errors and len(powers) < 2:
        raise SensorCheckError(
            f"{name}: no power readings: {getattr(m, 'read_error', '')} ({errors} failed)"
        )
    if len(powers) < 2 or max(powers, default=0.0) <= 0:
        raise SensorCheckError(f"{name}: no power readings during the load")
    if len(set(powers)) == 1:
        raise SensorCheckError(
            f"{name}: the power reading stayed at {powers[0]:g} W for {m.time_s:.2f} s of load: "
            "a stuck sensor (or one that does not see this GPU)"
        )
    times = list(getattr(m, "power_times_s", []))
    interval_s = m.time_s / max(len(powers) - 1, 1)
    update_s = update_period_s(times, powers) if len(times) == len(powers) else math.nan
    sampled_j = float(getattr(m, "sampled_energy_j", m.energy_j))
    counter_j = getattr(m, "counter_energy_j", None)
    diff_pct = None
    if counter_j is not None and counter_j > 0:
        diff_pct = 100.0 * (sampled_j - counter_j) / counter_j
    peak_w, avg_w = m.peak_power_w, m.avg_power_w
    ok, margin, text = verdict(update_s, interval_s, diff_pct, peak_w / avg_w if avg_w else 1.0)
    return SensorCheck(
        device=name,
        sensor=device.info.sensor.label,
        window_s=m.time_s,
        steps=m.steps,
        power_samples=len(powers),
        sample_interval_s=interval_s,
        update_period_s=update_s,
        sampled_energy_j=sampled_j,
        counter_energy_j=counter_j,
        counter_diff_pct=diff_pct,
        avg_power_w=avg_w,
        peak_power_w=peak_w,
        clock_mhz=float(getattr(m, "clock_mhz", math.nan)),
        clock_min_mhz=float(getattr(m, "clock_min_mhz", math.nan)),
        clock_max_mhz=float(getattr(m, "clock_max_mhz", math.nan)),
        can_enforce_cap=ok,
        margin_pct=margin,
        verdict=text,
    )


@dataclass(frozen=True)
class EmulatedCheck:
    """What ``check_emulated`` read from an emulated backend (kebab-case keys in
    ``to_dict``): the backend's own figures for the load, and what they cannot tell."""

    device: str
    backend: str
    source: str
    batch_size: int
    knob: str
    window_s: float
    steps: int
    step_time_s: float
    avg_power_w: float
    peak_power_w: float
    board_sensor: str | None
    readings: str
    cap: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "backend": self.backend,
            "sensor": None,
            "source": self.source,
            "batch-size": self.batch_size,
            "knob": self.knob,
            "window-s": self.window_s,
            "steps": self.steps,
            "step-time-s": self.step_time_s,
            "avg-power-w": self.avg_power_w,
            "peak-power-w": self.peak_power_w,
            "board-sensor": self.board_sensor,
            "readings": self.readings,
            "can-enforce-cap": None,
            "cap": self.cap,
        }


def is_emulated(device: Device) -> bool:
    """Whether ``device`` runs on an emulated clock (twin, replay): it has no sensor."""
    return isinstance(device, EmulatedDevice)


def _emulated_source(device: Device, workload: Workload) -> tuple[str, str, str]:
    """(source, what the readings are, what the check can say about a cap) per backend."""
    table_for = getattr(device, "table_for", None)
    if callable(table_for):
        table = table_for(workload)
        knob = table.knob
        values = ", ".join(f"{f:g}" for f in table.knob_values)
        source = (
            f"replay table {table.device}/{table.model}: {len(table.rows)} cells, batch sizes "
            f"{', '.join(map(str, table.batch_sizes))} × {knob.label} {values} {knob.unit}"
            + (f" ({table.source})" if table.source else "")
        )
        return (
            source,
            "no sensor: each reading is the table's cell for (b, "
            f"{knob.label}), measured elsewhere and averaged over its window",
            "no cap enforcement: nothing here runs on a GPU; the replay's cap guard only "
            "moves to the table's next lower cell",
        )
    spec_source = getattr(getattr(device, "spec", None), "source", "")
    return (
        "the digital twin's power model" + (f" ({spec_source})" if spec_source else ""),
        "no sensor: each reading is the model's figure for one step on the emulated clock",
        "not judged: a twin has no sensor; in a simulation its cap guard sees each modelled "
        "step's peak; run --check on the board to judge the board's sensor",
    )


def check_emulated(
    device: Device, workload: Workload, batch_size: int, *, seconds: float = 5.0
) -> EmulatedCheck:
    """The emulated backend's figures for ``batch_size`` at the device's current knob value
    over ``seconds`` of emulated time (at most ``EMULATED_MAX_STEPS`` steps); no step runs
    on the host (module docstring)."""
    if not is_emulated(device):
        raise ValueError(f"check_emulated: {device.info.backend} is not an emulated backend")
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds: must be a number of seconds > 0, got {seconds!r}")
    source, readings, cap = _emulated_source(device, workload)
    with device.measure(workload) as meter:
        while meter.time_s < seconds and meter.measurement.steps < EMULATED_MAX_STEPS:
            meter.step(batch_size, lambda: None)
    m = meter.measurement
    info = device.info
    knob = getattr(device, "knob", None)
    unit, label = (knob.unit, knob.label) if knob is not None else ("MHz", "GPU frequency")
    board = info.board_sensor
    return EmulatedCheck(
        device=f"{info.kind} ({info.backend})",
        backend=info.backend,
        source=source,
        batch_size=batch_size,
        knob=f"{label} {device.current_knob_value():g} {unit}",
        window_s=m.time_s,
        steps=m.steps,
        step_time_s=m.time_s / m.steps if m.steps else math.nan,
        avg_power_w=m.avg_power_w,
        peak_power_w=m.peak_power_w,
        board_sensor=board.label if board is not None else None,
        readings=readings,
        cap=cap,
    )


def emulated_text(check: EmulatedCheck) -> list[str]:
    """The emulated check as lines of text."""
    board = (
        f"{check.board_sensor} (the real board's: run --check there)"
        if check.board_sensor
        else "none known"
    )
    return [
        f"check of {check.device}: {check.steps} modelled steps over {check.window_s:.2f} s "
        "of emulated time, none run on the host",
        f"  figures from      {check.source}",
        f"  load              b={check.batch_size} at {check.knob}: step "
        f"{check.step_time_s:.4g} s, avg {check.avg_power_w:.2f} W, "
        f"peak {check.peak_power_w:.2f} W",
        f"  sensor            {check.readings}",
        f"  board sensor      {board}",
        f"  can enforce a cap {check.cap}",
    ]


def check_text(check: SensorCheck) -> list[str]:
    """The check as lines of text."""

    def num(x: float | None, fmt: str, unit: str) -> str:
        return "n/a" if x is None or not math.isfinite(x) else f"{x:{fmt}}{unit}"

    update = (
        num(check.update_period_s, ".3g", " s")
        if math.isfinite(check.update_period_s)
        else f"≤ {check.sample_interval_s:.3g} s (changed at every sample)"
    )
    counter = (
        f"sampled {check.sampled_energy_j:.2f} J vs counter {check.counter_energy_j:.2f} J "
        f"({check.counter_diff_pct:+.2f}%)"
        if check.counter_energy_j is not None and check.counter_diff_pct is not None
        else f"sampled {check.sampled_energy_j:.2f} J (no energy counter)"
    )
    return [
        f"sensor check of {check.device}, measure only: {check.steps} steps over "
        f"{check.window_s:.2f} s, {check.power_samples} power samples "
        f"(every {check.sample_interval_s * 1e3:.0f} ms)",
        f"  sensor            {check.sensor}",
        f"  update period     {update}",
        f"  energy            {counter}",
        f"  power             avg {check.avg_power_w:.2f} W, peak {check.peak_power_w:.2f} W, "
        f"peak/avg {check.peak_to_avg:.3f}",
        f"  clock during load median {num(check.clock_mhz, 'g', ' MHz')} "
        f"(lowest {num(check.clock_min_mhz, 'g', '')}, highest "
        f"{num(check.clock_max_mhz, 'g', '')})",
        f"  can enforce a cap {check.verdict}",
    ]
