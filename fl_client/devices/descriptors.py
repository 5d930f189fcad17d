"""Device descriptors: each board's ``configs/devices/<kind>.toml``, read and validated.

A descriptor (``DeviceSpec``) holds a board's hardware facts (its GPU frequency table,
memory, power rail, NVIDIA's power modes), B1's frequency bands, the caps it is meant to be
run under, the coefficients of its digital twin's model (``fl_client.devices.simulated``)
and the numbers of its real power sensor. Every backend reads it: the twin for its model,
the ``jetson`` and ``replay`` backends for the board's B1 bands and sensor. The folder is
``$POWERFL_CONFIG_DIR`` when set, else the twins the package ships.

A malformed descriptor is a ``DeviceSpecError`` naming the file, the key and what is
allowed; an unknown key names the nearest known one.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_client.devices.base import (
    FREQ_TOLERANCE_MHZ,
    B1Band,
    DeviceInfo,
    InvalidFrequencyError,
    SensorSpec,
)
from fl_client.devices.names import key_hint
from fl_client.devices.sampler import DEFAULT_SAMPLE_RATE_HZ
from fl_client.devices.sensors import (
    INA3221_SOURCE,
    INA3221_UPDATE_PERIOD_S,
    INSTANT_MIN_POWER_SAMPLES,
    REAL_MIN_WINDOW_S,
    TWIN_SENSOR,
    ina3221_sensor,
)
from fl_client.shipped import shipped_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (JetPack 6): the tomli backport has the same API
    import tomli as tomllib

#: The backend of the digital twins these descriptors describe.
TWIN_BACKEND = "simulated"
CONFIG_DIR_ENV = "POWERFL_CONFIG_DIR"
#: The twins shipped in ``configs/devices``; ``available_device_kinds()`` lists what the
#: active config folder holds (``$POWERFL_CONFIG_DIR`` may add more).
DEVICE_KINDS: tuple[str, ...] = (
    "jetson-nano",
    "jetson-tx2-nx",
    "jetson-orin-nano",
    "jetson-agx-orin",
)


class DeviceSpecError(ValueError):
    """A device descriptor (TOML) that cannot be used; the message names file and key."""


# ---------------------------------------------------------------------------------------
# The descriptor
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSpec:
    """One board's descriptor: hardware facts, B1 bands, and the twin's model coefficients.

    Attributes
    ----------
    kind, display_name : str
        Key (``jetson-nano``) and human name.
    gpu_freqs_mhz : tuple of float
        The GPU devfreq table in MHz, strictly ascending; the default (restore) is the last.
    memory_bytes : int
        DRAM shared by CPU and GPU.
    power_rail : str
        The rail the twin's power readings (and the cap) refer to.
    nvpmodel_budgets_w : tuple of (str, float)
        NVIDIA's power modes and their budgets, for reference and suggested caps.
    b1_freq_caps : tuple of B1Band
        B1's safe frequency per P_max band, ascending; the last band is the no-cap one.
    suggested_caps_w : tuple of float
        Caps this twin is meant to be run under, tight to none (inf).
    idle_power_w, base_power_w, gpu_power_w : float
        Board idle, extra while training (CPU, DRAM), GPU dynamic power at f_max, V_max,
        a = 1 and ρ = 1 (TOML ``[power]`` ``idle-w``, ``training-base-w``, ``gpu-dynamic-w``).
    voltage_min_v, voltage_max_v, voltage_knee_mhz : float
        Shape of V(f): flat at V_min up to the knee, linear to V_max at f_max.
    avg_to_peak : float
        Average over peak dynamic power within a step (in (0, 1]).
    host_time_s : float
        CPU-side time per step (Python, launches, optimizer bookkeeping).
    gpu_flops_per_cycle : float
        K: training FLOPs per GPU clock cycle at full efficiency (η = 1).
    gpu_overhead_samples : float
        Per-step GPU overhead as a number of samples' worth of work.
    flops_exponent : float
        κ: how much a sample's FLOPs add to the parallel work x = b · (F / 1 GFLOP)^κ.
    time_half_x, time_exponent : float
        x_t and γ of the compute efficiency η(x).
    power_half_x, power_exponent : float
        x_p and β of the power activity a(x).
    time_noise, power_noise : float
        Relative standard deviation of the twin's step time and power sensor.
    sensor_update_period_s, sensor_min_power_samples, sensor_min_window_s : float, int, float
        The real board's power sensor (its INA3221 read over sysfs, as the ``jetson``
        backend reads it): how often its reading changes, the least power samples and the
        least window per profiled cell (TOML ``[sensor]`` ``update-period-s``,
        ``min-power-samples``, ``min-window-s``; defaults in ``fl_client.devices.sensors``).
        The twin itself needs no window (one exact reading per step); it reports the window
        the board would have needed (``board_sensor``).
    source : str
        The file the spec was read from.
    """

    kind: str
    display_name: str
    gpu_freqs_mhz: tuple[float, ...]
    memory_bytes: int
    power_rail: str
    nvpmodel_budgets_w: tuple[tuple[str, float], ...]
    b1_freq_caps: tuple[B1Band, ...]
    suggested_caps_w: tuple[float, ...]
    idle_power_w: float
    base_power_w: float
    gpu_power_w: float
    voltage_min_v: float
    voltage_max_v: float
    voltage_knee_mhz: float
    avg_to_peak: float
    host_time_s: float
    gpu_flops_per_cycle: float
    gpu_overhead_samples: float
    flops_exponent: float
    time_half_x: float
    time_exponent: float
    power_half_x: float
    power_exponent: float
    time_noise: float
    power_noise: float
    sensor_update_period_s: float = INA3221_UPDATE_PERIOD_S
    sensor_min_power_samples: int = INSTANT_MIN_POWER_SAMPLES
    sensor_min_window_s: float = REAL_MIN_WINDOW_S
    source: str = field(default="", compare=False)

    @property
    def max_freq_mhz(self) -> float:
        return self.gpu_freqs_mhz[-1]

    @property
    def min_freq_mhz(self) -> float:
        return self.gpu_freqs_mhz[0]

    def info(self) -> DeviceInfo:
        """The QUERY-round descriptor of this twin (with its B1 bands; its sensor is exact,
        and ``board_sensor`` the real board's, at the default sampling rate)."""
        return DeviceInfo(
            kind=self.kind,
            backend=TWIN_BACKEND,
            knob_values=self.gpu_freqs_mhz,
            memory_bytes=self.memory_bytes,
            power_rail=self.power_rail,
            b1_bands=self.b1_freq_caps,
            sensor=TWIN_SENSOR,
            board_sensor=self.board_sensor(),
        )

    def board_sensor(self, sample_rate_hz: float = DEFAULT_SAMPLE_RATE_HZ) -> SensorSpec:
        """The real board's power sensor (INA3221 over sysfs) sampled at ``sample_rate_hz``."""
        where = f"; numbers of {Path(self.source).name}" if self.source else ""
        return ina3221_sensor(
            sample_rate_hz,
            update_period_s=self.sensor_update_period_s,
            min_power_samples=self.sensor_min_power_samples,
            min_window_s=self.sensor_min_window_s,
            source=INA3221_SOURCE + where,
        )

    def b1_max_knob_value(self, p_max_w: float | None) -> float:
        """B1's fixed frequency for the cap ``p_max_w`` (None or inf: no cap).

        The band with the largest lower bound ≤ P_max applies. A cap below the lowest band
        has no safe B1 frequency: that is an error, never a silent violation. Same rule as
        ``DeviceInfo.b1_max_knob_value`` (this spec's bands lie in its own table).
        """
        return self.info().b1_max_knob_value(p_max_w)

    def freq_index(self, freq_mhz: float) -> int:
        """Index of ``freq_mhz`` in the table (within ``FREQ_TOLERANCE_MHZ``)."""
        for i, f in enumerate(self.gpu_freqs_mhz):
            if abs(f - freq_mhz) <= FREQ_TOLERANCE_MHZ:
                return i
        allowed = ", ".join(f"{f:g}" for f in self.gpu_freqs_mhz)
        raise InvalidFrequencyError(
            f"gpu-freq-mhz: {freq_mhz:g} MHz is not in the frequency table of {self.kind}; "
            f"allowed: {allowed}"
        )


# ---------------------------------------------------------------------------------------
# Loading and validating descriptors
# ---------------------------------------------------------------------------------------


def device_config_dir(config_dir: Path | str | None = None) -> Path:
    """``config_dir`` if given, else ``$POWERFL_CONFIG_DIR``, else the twins the package
    ships (``configs/devices``)."""
    if config_dir is not None:
        return Path(config_dir).expanduser()
    env = os.environ.get(CONFIG_DIR_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return shipped_dir("devices")


def available_device_kinds(config_dir: Path | str | None = None) -> tuple[str, ...]:
    """The device kinds with a descriptor in the active config folder, sorted."""
    folder = device_config_dir(config_dir)
    if not folder.is_dir():
        return ()
    return tuple(sorted(p.stem for p in folder.glob("*.toml") if p.is_file()))


def load_device_spec(kind: str, config_dir: Path | str | None = None) -> DeviceSpec:
    """Read and validate ``<config_dir>/<kind>.toml``.

    Raises ``ValueError`` naming the key ``device`` and the allowed kinds for an unknown
    kind, ``FileNotFoundError`` when the folder is missing, and ``DeviceSpecError`` (a
    ``ValueError``) naming the file and key for a malformed descriptor.
    """
    folder = device_config_dir(config_dir)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"device descriptors: folder not found: {folder} "
            f"(set {CONFIG_DIR_ENV} to the folder holding <kind>.toml files)"
        )
    kinds = available_device_kinds(folder)
    if kind not in kinds:
        raise ValueError(
            f"device: unknown device kind {kind!r}; allowed: {', '.join(kinds) or '(none)'}"
            f" (descriptors in {folder})"
        )
    path = folder / f"{kind}.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise DeviceSpecError(f"{path}: not valid TOML: {err}") from None
    return parse_device_spec(data, str(path), kind)


def descriptor_board_sensor(
    kind: str,
    sample_rate_hz: float = DEFAULT_SAMPLE_RATE_HZ,
    config_dir: Path | str | None = None,
) -> SensorSpec | None:
    """The board's INA3221 of ``kind`` from its descriptor, sampled at ``sample_rate_hz``;
    None when no descriptor names this kind (a malformed one raises ``DeviceSpecError``)."""
    if not kind or kind not in available_device_kinds(config_dir):
        return None
    return load_device_spec(kind, config_dir).board_sensor(sample_rate_hz)


def descriptor_b1_bands(kind: str, config_dir: Path | str | None = None) -> tuple[B1Band, ...]:
    """B1 bands of ``kind`` from its descriptor ``<config_dir>/<kind>.toml``, for any backend.

    Empty when no descriptor names this kind (or the folder is missing): the device then
    has no bands and B1 runs at its highest frequency. A descriptor that exists but is
    malformed raises ``DeviceSpecError`` naming the file and key.
    """
    if not kind or kind not in available_device_kinds(config_dir):
        return ()
    return load_device_spec(kind, config_dir).b1_freq_caps


class _Reader:
    """Typed access to one TOML table with errors naming the file, section and key."""

    def __init__(self, data: Mapping[str, Any], where: str, section: str = "") -> None:
        self.data = data
        self.where = where
        self.section = section
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.section}.{name}" if self.section else name

    def error(self, name: str, message: str) -> DeviceSpecError:
        return DeviceSpecError(f"{self.where}: {self.key(name)}: {message}")

    def raw(self, name: str) -> Any:
        self.used.add(name)
        if name not in self.data:
            raise self.error(name, "missing")
        return self.data[name]

    def text(self, name: str) -> str:
        value = self.raw(name)
        if not isinstance(value, str) or not value.strip():
            raise self.error(name, f"expected a non-empty string, got {value!r}")
        return value

    def number(
        self, name: str, *, low: float = 0.0, high: float = math.inf, open_low: bool = True
    ) -> float:
        value = self.raw(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(name, f"expected a number, got {value!r}")
        x = float(value)
        too_low = x <= low if open_low else x < low
        if math.isnan(x) or too_low or x > high or math.isinf(x):
            lo = f"> {low:g}" if open_low else f"≥ {low:g}"
            hi = "" if math.isinf(high) else f" and ≤ {high:g}"
            raise self.error(name, f"must be a finite number {lo}{hi}, got {value!r}")
        return x

    def optional(self, name: str) -> bool:
        """Whether the optional key ``name`` is given (it counts as known either way)."""
        self.used.add(name)
        return name in self.data

    def integer(self, name: str) -> int:
        value = self.raw(name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.error(name, f"expected a positive integer, got {value!r}")
        return value

    def table(self, name: str) -> _Reader:
        value = self.raw(name)
        if not isinstance(value, dict):
            raise self.error(name, f"expected a table ([{self.key(name)}]), got {value!r}")
        return _Reader(value, self.where, self.key(name))

    def finish(self) -> None:
        """Refuse a key no reader asked for, naming the nearest known one."""
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            table = f"[{self.section}]" if self.section else "top level"
            raise DeviceSpecError(
                f"{self.where}: {', '.join(self.key(k) for k in unknown)}: unknown key(s) "
                f"at {table}{key_hint(self.key(unknown[0]), map(self.key, self.used))}"
            )


def _positive_float(value: Any, allow_inf: bool = False) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    x = float(value)
    if math.isnan(x) or x <= 0 or (math.isinf(x) and not allow_inf):
        return None
    return x


def _freqs_mhz(top: _Reader) -> tuple[float, ...]:
    """``gpu-freqs-mhz``: numbers > 0, strictly ascending."""
    raw_freqs = top.raw("gpu-freqs-mhz")
    freqs = [_positive_float(f) for f in raw_freqs] if isinstance(raw_freqs, list) else []
    if not freqs or any(f is None for f in freqs):
        raise top.error("gpu-freqs-mhz", f"expected a list of numbers > 0, got {raw_freqs!r}")
    freqs_mhz = tuple(float(f) for f in freqs if f is not None)
    if any(b <= a for a, b in itertools.pairwise(freqs_mhz)):
        raise top.error("gpu-freqs-mhz", "must be strictly ascending")
    return freqs_mhz


def _budgets_w(top: _Reader) -> tuple[tuple[str, float], ...]:
    """``[nvpmodel-budgets-w]``: each power mode's budget in W."""
    budgets_reader = top.table("nvpmodel-budgets-w")
    budgets = []
    for name in budgets_reader.data:
        budgets.append((name, budgets_reader.number(name)))
    budgets_reader.finish()
    return tuple(budgets)


def _b1_bands(top: _Reader, freqs_mhz: tuple[float, ...]) -> tuple[B1Band, ...]:
    """``[[b1-freq-caps]]``: bands ascending in cap and frequency, each frequency in the
    table, the last one the no-cap band."""
    raw_bands = top.raw("b1-freq-caps")
    if not isinstance(raw_bands, list) or not raw_bands:
        raise top.error("b1-freq-caps", "expected one or more [[b1-freq-caps]] tables")
    bands = []
    for i, item in enumerate(raw_bands):
        if not isinstance(item, dict):
            raise top.error("b1-freq-caps", f"entry #{i + 1}: expected a table, got {item!r}")
        band = _Reader(item, top.where, f"b1-freq-caps[{i}]")
        low = _positive_float(band.raw("min-p-max-w"), allow_inf=True)
        if low is None:
            raise band.error("min-p-max-w", f"expected W > 0 or inf, got {item['min-p-max-w']!r}")
        freq = band.number("freq-mhz")
        if not any(abs(freq - f) <= FREQ_TOLERANCE_MHZ for f in freqs_mhz):
            raise band.error("freq-mhz", f"{freq:g} MHz is not in gpu-freqs-mhz")
        band.finish()
        bands.append(B1Band(low, freq))
    if any(
        b.min_p_max_w <= a.min_p_max_w or b.freq_mhz < a.freq_mhz
        for a, b in itertools.pairwise(bands)
    ):
        raise top.error("b1-freq-caps", "bands must ascend in min-p-max-w and freq-mhz")
    if not math.isinf(bands[-1].min_p_max_w):
        raise top.error("b1-freq-caps", "the last band must be the no-cap band (min-p-max-w = inf)")
    return tuple(bands)


def _caps_w(top: _Reader) -> tuple[float, ...]:
    """``suggested-caps-w``: W > 0 or inf, sorted."""
    raw_caps = top.raw("suggested-caps-w")
    caps = (
        [_positive_float(c, allow_inf=True) for c in raw_caps] if isinstance(raw_caps, list) else []
    )
    if not caps or any(c is None for c in caps):
        raise top.error("suggested-caps-w", f"expected a list of W > 0 or inf, got {raw_caps!r}")
    return tuple(sorted(float(c) for c in caps if c is not None))


def parse_device_spec(data: Mapping[str, Any], where: str, kind: str | None = None) -> DeviceSpec:
    """Validate a parsed descriptor (``where`` names it in errors) and build the spec."""
    top = _Reader(data, where)
    spec_kind = top.text("kind")
    if kind is not None and spec_kind != kind:
        raise top.error("kind", f"{spec_kind!r} does not match the file name ({kind!r})")
    freqs_mhz = _freqs_mhz(top)
    budgets_w = _budgets_w(top)
    bands = _b1_bands(top, freqs_mhz)
    caps_w = _caps_w(top)
    power = top.table("power")
    time = top.table("time")
    par = top.table("parallelism")
    sensor = top.table("sensor")
    spec = DeviceSpec(
        kind=spec_kind,
        display_name=top.text("display-name"),
        gpu_freqs_mhz=freqs_mhz,
        memory_bytes=top.integer("memory-bytes"),
        power_rail=top.text("power-rail"),
        nvpmodel_budgets_w=budgets_w,
        b1_freq_caps=bands,
        suggested_caps_w=caps_w,
        idle_power_w=power.number("idle-w"),
        base_power_w=power.number("training-base-w", open_low=False),
        gpu_power_w=power.number("gpu-dynamic-w"),
        voltage_min_v=power.number("voltage-min-v"),
        voltage_max_v=power.number("voltage-max-v"),
        voltage_knee_mhz=power.number("voltage-knee-mhz"),
        avg_to_peak=power.number("avg-to-peak", high=1.0),
        host_time_s=time.number("host-per-step-s", open_low=False),
        gpu_flops_per_cycle=time.number("gpu-flops-per-cycle"),
        gpu_overhead_samples=time.number("gpu-overhead-samples", open_low=False),
        flops_exponent=par.number("flops-exponent", open_low=False, high=1.0),
        time_half_x=par.number("time-half-x"),
        time_exponent=par.number("time-exponent"),
        power_half_x=par.number("power-half-x"),
        power_exponent=par.number("power-exponent"),
        time_noise=sensor.number("time-noise", open_low=False, high=0.2),
        power_noise=sensor.number("power-noise", open_low=False, high=0.2),
        **_board_sensor_fields(sensor),
        source=where,
    )
    if spec.voltage_max_v < spec.voltage_min_v:
        raise power.error("voltage-max-v", "must be ≥ voltage-min-v")
    for reader in (power, time, par, sensor, top):
        reader.finish()
    return spec


def _board_sensor_fields(sensor: _Reader) -> dict[str, Any]:
    """The optional ``[sensor]`` keys of the real board's power sensor (else the defaults)."""
    out: dict[str, Any] = {}
    if sensor.optional("update-period-s"):
        out["sensor_update_period_s"] = sensor.number("update-period-s", high=60.0)
    if sensor.optional("min-power-samples"):
        out["sensor_min_power_samples"] = sensor.integer("min-power-samples")
    if sensor.optional("min-window-s"):
        out["sensor_min_window_s"] = sensor.number("min-window-s", open_low=False, high=600.0)
    return out
