"""Digital twins of Jetson boards: real frequency tables, a time and a power model, noise.

A twin (``SimulatedDevice``) implements the ``Device`` protocol without hardware: every
training step's ``fn`` runs for real on the host (the model really trains), and the step's
device time, power and energy come from the model below at the locked GPU frequency, on an
emulated clock. Each board is described by ``configs/devices/<kind>.toml``
(``DeviceSpec``); the model is pure functions of (spec, b, f, FLOPs per sample) so the
selector, benchmarks and tests can use it without a device.

Model (b = batch size, F = training FLOPs per sample, f = GPU frequency in MHz)::

    x       = b · (F / 1 GFLOP)^κ                parallel work a step's kernels expose
    η(x)    = x^γ / (x^γ + x_t^γ)                compute efficiency: small steps leave SMs idle
    t_gpu   = (b / η + b_u) · F / (K · f)        K FLOP per cycle at full efficiency; b_u:
                                                 per-step GPU overhead (optimizer, launch tails)
    t_step  = t_host + t_gpu                     t_host: CPU-side time per step, f-independent
    ρ       = t_gpu / t_step                     GPU busy fraction (utilisation): grows with
                                                 the work per step b·F, saturates at 1
    a(x)    = x^β / (x^β + x_p^β)                power activity: keeps growing past η's knee
    V(f)    = V_min up to the knee, then linear to V_max at f_max
    P_peak  = P_idle + P_base + P_gpu · (f / f_max) · (V(f) / V_max)² · a · ρ
    P_avg   = P_idle + P_base + r · (P_peak − P_idle − P_base),   r = avg-to-peak < 1

Power rises with b (a and ρ) and with f (ρ·f grows with f, and V(f)); time per sample
falls with f. A model's cost enters only through F. Two saturating terms are needed
because the paper's Nano data pull apart: b=64 is nearly as efficient per sample as b=128
(Fig. 1, η saturated) yet draws clearly less peak power (a still growing). The
coefficients of each board and their sources are in its TOML file.

Noiseless peak power (W) and time per sample (ms) on the Jetson Nano twin for the default
small ``cnn`` (16 MFLOP/sample) and ResNet18 (3.33 GFLOP/sample) at 3×32×32, from
``_calibration_table({m: fl_client.model_zoo.train_flops_per_sample(m) for m in ("cnn",
"resnet18")})``::

                        307.2 MHz         460.8 MHz         614.4 MHz         921.6 MHz
    model      b      W ms/sample       W ms/sample       W ms/sample       W ms/sample
    cnn        4   2.34     5.695    2.47     4.214    2.58     3.473    2.83     2.732
    cnn        8   2.44     2.321    2.59     1.756    2.72     1.473    2.99     1.190
    cnn       32   2.86     0.694    3.18     0.515    3.44     0.425    4.02     0.336
    cnn       64   3.25     0.526    3.77     0.377    4.22     0.302    5.26     0.227
    cnn      128   3.74     0.458    4.52     0.319    5.25     0.249    6.98     0.179
    resnet18   4   2.63   334.559    2.97   223.456    3.30   167.905    4.17   112.353
    resnet18   8   2.86   165.283    3.31   110.397    3.76    82.954    4.91    55.511
    resnet18  32   3.51    93.254    4.29    62.221    5.06    46.705    7.06    31.189
    resnet18  64   3.94    87.523    4.94    58.375    5.93    43.801    8.49    29.226
    resnet18 128   4.44    85.635    5.68    57.103    6.92    42.837   10.13    28.571

The paper's calibration points (Fig. 1, Fig. 2, B1's bands) are checked by
``tests/fl_client/devices/test_simulated.py``; the digits above are illustrative.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fl_client.devices.base import (
    FREQ_TOLERANCE_MHZ,
    B1Band,
    DeviceInfo,
    InvalidFrequencyError,
    SensorSpec,
    Workload,
    level_below,
)
from fl_client.devices.emulated import EmulatedDevice, EmulatedMeter
from fl_client.devices.names import key_hint
from fl_client.devices.sampler import DEFAULT_SAMPLE_RATE_HZ, CapGuard
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

BACKEND = "simulated"
CONFIG_DIR_ENV = "POWERFL_CONFIG_DIR"
#: The twins shipped in ``configs/devices``; ``available_device_kinds()`` lists what the
#: active config folder holds (``$POWERFL_CONFIG_DIR`` may add more).
DEVICE_KINDS: tuple[str, ...] = (
    "jetson-nano",
    "jetson-tx2-nx",
    "jetson-orin-nano",
    "jetson-agx-orin",
)
#: FLOPs per sample the parallel-work term is relative to (1 GFLOP).
REF_FLOPS = 1e9
#: Multiplicative noise is a normal draw clipped at this many standard deviations.
NOISE_CLIP_SIGMA = 3.0


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
            backend=BACKEND,
            gpu_freqs_mhz=self.gpu_freqs_mhz,
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

    def b1_freq_cap_mhz(self, p_max_w: float | None) -> float:
        """B1's fixed frequency for the cap ``p_max_w`` (None or inf: no cap).

        The band with the largest lower bound ≤ P_max applies. A cap below the lowest band
        has no safe B1 frequency: that is an error, never a silent violation. Same rule as
        ``DeviceInfo.b1_freq_cap_mhz`` (this spec's bands lie in its own table).
        """
        return self.info().b1_freq_cap_mhz(p_max_w)

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


def parse_device_spec(data: Mapping[str, Any], where: str, kind: str | None = None) -> DeviceSpec:
    """Validate a parsed descriptor (``where`` names it in errors) and build the spec."""
    top = _Reader(data, where)
    spec_kind = top.text("kind")
    if kind is not None and spec_kind != kind:
        raise top.error("kind", f"{spec_kind!r} does not match the file name ({kind!r})")

    raw_freqs = top.raw("gpu-freqs-mhz")
    freqs = [_positive_float(f) for f in raw_freqs] if isinstance(raw_freqs, list) else []
    if not freqs or any(f is None for f in freqs):
        raise top.error("gpu-freqs-mhz", f"expected a list of numbers > 0, got {raw_freqs!r}")
    freqs_mhz = tuple(float(f) for f in freqs if f is not None)
    if any(b <= a for a, b in itertools.pairwise(freqs_mhz)):
        raise top.error("gpu-freqs-mhz", "must be strictly ascending")

    budgets_reader = top.table("nvpmodel-budgets-w")
    budgets = []
    for name in budgets_reader.data:
        budgets.append((name, budgets_reader.number(name)))
    budgets_reader.finish()

    raw_bands = top.raw("b1-freq-caps")
    if not isinstance(raw_bands, list) or not raw_bands:
        raise top.error("b1-freq-caps", "expected one or more [[b1-freq-caps]] tables")
    bands = []
    for i, item in enumerate(raw_bands):
        if not isinstance(item, dict):
            raise top.error("b1-freq-caps", f"entry #{i + 1}: expected a table, got {item!r}")
        band = _Reader(item, where, f"b1-freq-caps[{i}]")
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

    raw_caps = top.raw("suggested-caps-w")
    caps = (
        [_positive_float(c, allow_inf=True) for c in raw_caps] if isinstance(raw_caps, list) else []
    )
    if not caps or any(c is None for c in caps):
        raise top.error("suggested-caps-w", f"expected a list of W > 0 or inf, got {raw_caps!r}")
    caps_w = tuple(sorted(float(c) for c in caps if c is not None))

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
        nvpmodel_budgets_w=tuple(budgets),
        b1_freq_caps=tuple(bands),
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


# ---------------------------------------------------------------------------------------
# The model: pure functions of (spec, b, f, FLOPs per sample)
# ---------------------------------------------------------------------------------------


def _check_inputs(batch_size: int, freq_mhz: float, flops_per_sample: float) -> None:
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch-size: must be an integer ≥ 1, got {batch_size!r}")
    if not (math.isfinite(freq_mhz) and freq_mhz > 0):
        raise ValueError(f"gpu-freq-mhz: must be > 0, got {freq_mhz!r}")
    if not (math.isfinite(flops_per_sample) and flops_per_sample > 0):
        raise ValueError(f"flops-per-sample: must be > 0, got {flops_per_sample!r}")


def parallel_work(spec: DeviceSpec, batch_size: int, flops_per_sample: float) -> float:
    """x = b · (F / 1 GFLOP)^κ: how much independent work a step's kernels expose."""
    return float(batch_size * (flops_per_sample / REF_FLOPS) ** spec.flops_exponent)


def _hill(x: float, half: float, exponent: float) -> float:
    return float(x**exponent / (x**exponent + half**exponent))


def compute_efficiency(spec: DeviceSpec, batch_size: int, flops_per_sample: float) -> float:
    """η in (0, 1): share of peak throughput a step's kernels reach; saturates with x."""
    x = parallel_work(spec, batch_size, flops_per_sample)
    return _hill(x, spec.time_half_x, spec.time_exponent)


def power_activity(spec: DeviceSpec, batch_size: int, flops_per_sample: float) -> float:
    """a in (0, 1): how much of the GPU switches while it computes; grows with x."""
    x = parallel_work(spec, batch_size, flops_per_sample)
    return _hill(x, spec.power_half_x, spec.power_exponent)


def gpu_time_s(
    spec: DeviceSpec, batch_size: int, freq_mhz: float, flops_per_sample: float
) -> float:
    """GPU part of one step: b·F at efficiency η plus b_u·F of overhead, at K·f FLOP/s."""
    _check_inputs(batch_size, freq_mhz, flops_per_sample)
    eta = compute_efficiency(spec, batch_size, flops_per_sample)
    work_flops = (batch_size / eta + spec.gpu_overhead_samples) * flops_per_sample
    return work_flops / (spec.gpu_flops_per_cycle * freq_mhz * 1e6)


def step_time_s(
    spec: DeviceSpec, batch_size: int, freq_mhz: float, flops_per_sample: float
) -> float:
    """Noiseless device time of one training step of ``batch_size`` samples at ``freq_mhz``."""
    return spec.host_time_s + gpu_time_s(spec, batch_size, freq_mhz, flops_per_sample)


def time_per_sample_s(
    spec: DeviceSpec, batch_size: int, freq_mhz: float, flops_per_sample: float
) -> float:
    """Noiseless step time divided by the batch size (the paper's T_s / s)."""
    return step_time_s(spec, batch_size, freq_mhz, flops_per_sample) / batch_size


def gpu_busy_fraction(
    spec: DeviceSpec, batch_size: int, freq_mhz: float, flops_per_sample: float
) -> float:
    """ρ: share of the step the GPU computes (the rest is host time)."""
    t_gpu = gpu_time_s(spec, batch_size, freq_mhz, flops_per_sample)
    return t_gpu / (t_gpu + spec.host_time_s)


def voltage_v(spec: DeviceSpec, freq_mhz: float) -> float:
    """GPU rail voltage at ``freq_mhz``: flat at V_min up to the knee, then linear to V_max."""
    if freq_mhz <= spec.voltage_knee_mhz or spec.max_freq_mhz <= spec.voltage_knee_mhz:
        return spec.voltage_min_v
    span = (freq_mhz - spec.voltage_knee_mhz) / (spec.max_freq_mhz - spec.voltage_knee_mhz)
    return spec.voltage_min_v + (spec.voltage_max_v - spec.voltage_min_v) * span


def _dynamic_power_w(
    spec: DeviceSpec, batch_size: int, freq_mhz: float, flops_per_sample: float
) -> float:
    rho = gpu_busy_fraction(spec, batch_size, freq_mhz, flops_per_sample)
    volt = voltage_v(spec, freq_mhz) / spec.voltage_max_v
    scale = (freq_mhz / spec.max_freq_mhz) * volt * volt
    return spec.gpu_power_w * scale * power_activity(spec, batch_size, flops_per_sample) * rho


def power_w(spec: DeviceSpec, batch_size: int, freq_mhz: float, flops_per_sample: float) -> float:
    """Noiseless peak power in W on ``spec.power_rail`` while training (LUT_power)."""
    dyn = _dynamic_power_w(spec, batch_size, freq_mhz, flops_per_sample)
    return spec.idle_power_w + spec.base_power_w + dyn


def avg_power_w(
    spec: DeviceSpec, batch_size: int, freq_mhz: float, flops_per_sample: float
) -> float:
    """Noiseless average power in W over a step (a bit below the peak)."""
    dyn = _dynamic_power_w(spec, batch_size, freq_mhz, flops_per_sample)
    return spec.idle_power_w + spec.base_power_w + spec.avg_to_peak * dyn


def energy_per_sample_j(
    spec: DeviceSpec, batch_size: int, freq_mhz: float, flops_per_sample: float
) -> float:
    """Noiseless energy per sample in J (average power × time per sample)."""
    return avg_power_w(spec, batch_size, freq_mhz, flops_per_sample) * time_per_sample_s(
        spec, batch_size, freq_mhz, flops_per_sample
    )


def highest_feasible_freq_mhz(
    spec: DeviceSpec, batch_size: int, p_max_w: float, flops_per_sample: float
) -> float | None:
    """Highest table frequency whose noiseless peak power is < ``p_max_w``; None if none."""
    feasible = [
        f for f in spec.gpu_freqs_mhz if power_w(spec, batch_size, f, flops_per_sample) < p_max_w
    ]
    return feasible[-1] if feasible else None


def lowest_power_w(spec: DeviceSpec, batch_sizes: Iterable[int], flops_per_sample: float) -> float:
    """The least noiseless peak power of any (b, f): caps at or below it are infeasible."""
    b_list = list(batch_sizes)
    if not b_list:
        raise ValueError("batch-sizes: empty")
    return min(power_w(spec, b, spec.min_freq_mhz, flops_per_sample) for b in b_list)


def suggested_caps_w(spec: DeviceSpec) -> tuple[float, ...]:
    """Caps this twin is meant to run under, tight to none (``math.inf``)."""
    return spec.suggested_caps_w


# ---------------------------------------------------------------------------------------
# The device
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRecord:
    """What the twin's sensor reported for one step (noise included)."""

    batch_size: int
    freq_mhz: float
    time_s: float
    peak_power_w: float
    avg_power_w: float


class SimulatedMeter(EmulatedMeter):
    """Runs each step for real on the host; accounts its device time and power from the twin
    (with the cap guard: ``EmulatedMeter``)."""

    def __init__(
        self, device: SimulatedDevice, workload: Workload, guard: CapGuard | None = None
    ) -> None:
        super().__init__(device, guard)
        self._twin = device
        self._workload = workload
        self._flops = workload.flops_per_sample
        self.records: list[StepRecord] = []

    def step(self, batch_size: int, fn: Callable[[], object]) -> None:
        """Run ``fn`` (one real minibatch), then advance the twin's clock by its modelled time.

        Bad input fails before ``fn`` runs; if ``fn`` raises, nothing is accounted.
        """
        _check_inputs(batch_size, self._twin.current_gpu_freq_mhz(), self._flops)
        fn()
        record = self._twin._model_step(batch_size, self._flops)
        self.records.append(record)
        self.account(batch_size, record.time_s, record.avg_power_w, record.peak_power_w)


class SimulatedDevice(EmulatedDevice):
    """Digital twin of one Jetson board (``Device`` protocol) on an emulated clock.

    Like the hardware backends it has a cap guard (``cap_guard``), off unless armed, whose
    window is measured on the emulated clock.

    Parameters
    ----------
    spec : DeviceSpec
        The board (``load_device_spec(kind)``).
    seed : int
        Seed of the sensor and timing noise; the same seed and calls give the same numbers.
    noise : bool
        False: every step reports the noiseless model.
    slowdown : float
        Drift knob (≥ 1, default 1 = none): every step takes this many times longer than
        the model says, as under thermal throttling or a busy neighbour process.
    extra_power_w : float
        Drift knob (≥ 0, default 0): power drawn on the rail beyond the model (peak and
        average), e.g. by a neighbour process.
    """

    def __init__(
        self,
        spec: DeviceSpec,
        seed: int = 0,
        noise: bool = True,
        *,
        slowdown: float = 1.0,
        extra_power_w: float = 0.0,
    ) -> None:
        if not (1.0 <= slowdown < math.inf):
            raise ValueError(f"twin-slowdown: must be ≥ 1, got {slowdown!r}")
        if not (0.0 <= extra_power_w < math.inf):
            raise ValueError(f"twin-extra-power-w: must be ≥ 0 W, got {extra_power_w!r}")
        self._slowdown = float(slowdown)
        self._extra_power_w = float(extra_power_w)
        self._spec = spec
        self._seed = seed
        self._noise = noise
        self._rng = np.random.default_rng(seed)
        self._freq_mhz = spec.max_freq_mhz
        self._info = spec.info()

    @property
    def spec(self) -> DeviceSpec:
        return self._spec

    def current_gpu_freq_mhz(self) -> float:
        return self._freq_mhz

    def set_gpu_freq_mhz(self, freq_mhz: float) -> None:
        self._freq_mhz = self.gpu_freqs_mhz[self._spec.freq_index(float(freq_mhz))]

    def restore(self) -> None:
        """Back to the default (the highest frequency, as the governor would run it)."""
        self._freq_mhz = self._spec.max_freq_mhz

    def step_down_gpu_freq_mhz(self) -> float | None:
        """Go one table level below the current frequency (the cap guard's move).

        Returns the new frequency, or None when already at the lowest.
        """
        lower = level_below(self.gpu_freqs_mhz, self._freq_mhz)
        if lower is not None:
            self._freq_mhz = lower
        return lower

    def _factor(self, sigma: float) -> float:
        if not self._noise or sigma == 0:
            return 1.0
        z = float(np.clip(self._rng.standard_normal(), -NOISE_CLIP_SIGMA, NOISE_CLIP_SIGMA))
        return 1.0 + sigma * z

    def _model_step(self, batch_size: int, flops: float) -> StepRecord:
        """One step's sensor report at the current frequency, noise included."""
        spec, f = self._spec, self._freq_mhz
        t = step_time_s(spec, batch_size, f, flops) * self._factor(spec.time_noise)
        peak = power_w(spec, batch_size, f, flops) * self._factor(spec.power_noise)
        avg = avg_power_w(spec, batch_size, f, flops) * self._factor(spec.power_noise)
        t, peak, avg = t * self._slowdown, peak + self._extra_power_w, avg + self._extra_power_w
        return StepRecord(int(batch_size), f, t, peak, min(avg, peak))

    @contextmanager
    def measure(self, workload: Workload) -> Iterator[SimulatedMeter]:
        """A Meter whose steps run for real and are accounted on the twin's clock and sensor."""
        if not (math.isfinite(workload.flops_per_sample) and workload.flops_per_sample > 0):
            raise ValueError(
                f"flops-per-sample: the twin needs the workload's FLOPs per sample > 0, got "
                f"{workload.flops_per_sample!r} for {workload.key}"
            )
        yield SimulatedMeter(self, workload, self._new_guard())

    def describe(self) -> dict[str, Any]:
        spec = self._spec
        return {
            "kind": spec.kind,
            "backend": BACKEND,
            "display-name": spec.display_name,
            "gpu-freqs-mhz": list(spec.gpu_freqs_mhz),
            "cur-freq-mhz": self._freq_mhz,
            "memory-bytes": spec.memory_bytes,
            "power-rail": spec.power_rail,
            "seed": self._seed,
            "noise": self._noise,
            "clock-s": self._clock_s,
            "board-sensor": self._info.board_sensor.label if self._info.board_sensor else None,
            "source": spec.source,
        }


# ---------------------------------------------------------------------------------------
# The docstring's table
# ---------------------------------------------------------------------------------------


def _calibration_table(
    flops_per_sample_by_model: Mapping[str, float], kind: str = "jetson-nano"
) -> str:
    """Noiseless peak power and time per sample of each model (the module docstring's table).

    ``flops_per_sample_by_model`` maps a model name to its training FLOPs per sample; the
    caller computes them (the device layer knows no models).
    """
    spec = load_device_spec(kind)
    freqs_mhz = (307.2, 460.8, 614.4, 921.6) if kind == "jetson-nano" else spec.gpu_freqs_mhz[::4]
    head = "".join(f"{f'{f:g} MHz':>16}  " for f in freqs_mhz)
    sub = "".join(f"{'W':>6} {'ms/sample':>9}  " for _ in freqs_mhz)
    rows = [f"{'':13}{head}".rstrip(), f"{'model':<8}{'b':>4} {sub}".rstrip()]
    for model, flops in flops_per_sample_by_model.items():
        for b in (4, 8, 32, 64, 128):
            cells = "".join(
                f"{power_w(spec, b, f, flops):>6.2f}"
                f" {1e3 * time_per_sample_s(spec, b, f, flops):>9.3f}  "
                for f in freqs_mhz
            )
            rows.append(f"{model:<8}{b:>4} {cells}".rstrip())
    return "\n".join(rows)
