"""The one Device protocol that every backend (twin, Jetson, NVML, replay) implements."""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from fl_client.power import parse_p_max_w

log = logging.getLogger(__name__)

#: Fixed frequency caps and fixed frequencies are often quoted in whole MHz (the paper's
#: "307 / 614 / 921 MHz" are the Nano's 307.2 / 614.4 / 921.6 MHz); table steps are ≥ 25 MHz
#: apart, so matching a table frequency within 1 MHz cannot pick a neighbouring step.
FREQ_TOLERANCE_MHZ = 1.0
#: (kind, backend) pairs already told that they have no B1 bands (said once per process).
_NO_BANDS_LOGGED: set[tuple[str, str]] = set()

_L = TypeVar("_L")


def level_below(levels: Sequence[_L], current: _L | None) -> _L | None:
    """The level one below ``current`` in the ascending ``levels`` (the cap guard's step
    down); None when ``current`` is None (not locked) or already the lowest level."""
    if current is None:
        return None
    i = levels.index(current)
    return levels[i - 1] if i > 0 else None


class DeviceError(RuntimeError):
    """Base class of every error a device backend raises; messages say what to do."""


class DeviceUnavailableError(DeviceError):
    """The backend cannot run here (library missing, no such hardware)."""


class DevicePermissionError(DeviceError):
    """The backend found the hardware but may not change it (e.g. not root)."""


class InvalidFrequencyError(DeviceError, ValueError):
    """A frequency that is not in the device's table was requested."""


@dataclass(frozen=True)
class Knob:
    """The system knob a device sets and a LUT's columns are (Eq. 4's f), with its unit.

    A device sets one knob: the GPU frequency (Jetson devfreq, NVML locked clocks) or a GPU
    power limit (NVML ``nvmlDeviceSetPowerManagementLimit``, as Zeus does, and the Zeus
    traces). The selector reads tables of either. The Device protocol's ``knob_values``,
    ``current_knob_value`` and ``set_knob_value`` carry the values of the device's knob
    (``device.knob``) in its unit; every record names the knob and writes its values under
    the knob's own key and unit.

    Attributes
    ----------
    key : str
        Column name in replay tables and Python (``freq_mhz``, ``power_limit_w``).
    label : str
        Name in prose and messages.
    unit : str
        Unit of the column's values.
    setting : str
        The value of the node setting ``knob`` that asks for it (``frequency``,
        ``power-limit``).
    """

    key: str
    label: str
    unit: str
    setting: str

    @property
    def config_key(self) -> str:
        """Kebab-case key of a chosen value in reports (``gpu-freq-mhz``, ...)."""
        return "gpu-" + self.key.replace("_", "-")

    @property
    def values_key(self) -> str:
        """Kebab-case key of the knob's grid in records (``freqs-mhz``, ``power-limits-w``)."""
        return {"freq_mhz": "freqs-mhz", "power_limit_w": "power-limits-w"}[self.key]


GPU_FREQ_MHZ = Knob("freq_mhz", "GPU frequency", "MHz", "frequency")
GPU_POWER_LIMIT_W = Knob("power_limit_w", "GPU power limit", "W", "power-limit")
#: Knobs a table may be indexed by, by column name; frequency is the default.
KNOBS: dict[str, Knob] = {k.key: k for k in (GPU_FREQ_MHZ, GPU_POWER_LIMIT_W)}
#: Values of the node setting ``knob``: one of the knobs, or ``auto`` (the GPU frequency
#: where the backend can lock it, else the GPU power limit where it can set one).
KNOB_SETTINGS = (GPU_FREQ_MHZ.setting, GPU_POWER_LIMIT_W.setting, "auto")


def knob_for(key: str) -> Knob:
    """The ``Knob`` of a column name (``freq_mhz`` or ``power_limit_w``); ValueError otherwise."""
    found = KNOBS.get(str(key).strip().lower().replace("-", "_"))
    if found is None:
        raise ValueError(f"knob: unknown value {key!r}; allowed: {', '.join(KNOBS)}")
    return found


def device_knob(device: object) -> Knob:
    """The knob a device's ``knob_values`` are values of: the GPU frequency unless the
    device names another (``device.knob``: an NVML GPU selecting over power limits, a
    replay table of a power limit)."""
    knob = getattr(device, "knob", GPU_FREQ_MHZ)
    return knob if isinstance(knob, Knob) else GPU_FREQ_MHZ


def check_knob_setting(value: object) -> str:
    """The node setting ``knob`` (unset: ``frequency``); ValueError naming the allowed values."""
    text = GPU_FREQ_MHZ.setting if value is None else str(value).strip().lower()
    if text == "":
        text = GPU_FREQ_MHZ.setting
    if text not in KNOB_SETTINGS:
        raise ValueError(f"knob: unknown value {value!r}; allowed: {', '.join(KNOB_SETTINGS)}")
    return text


@dataclass(frozen=True)
class Workload:
    """What a device is asked to run: one model at one input shape.

    ``flops_per_sample`` counts forward plus backward FLOPs of one training sample; the
    caller, which knows the model, computes it (the device layer knows nothing of models).
    The digital twin turns it into time and power; real backends ignore it and measure.
    """

    model_name: str
    input_shape: tuple[int, ...]
    flops_per_sample: float
    param_count: int = 0

    @property
    def key(self) -> str:
        shape = "x".join(str(d) for d in self.input_shape)
        return f"{self.model_name}-{shape}"


@dataclass(frozen=True)
class B1Band:
    """B1's fixed GPU frequency for caps P_max ≥ ``min_p_max_w`` (inf: the no-cap band)."""

    min_p_max_w: float
    freq_mhz: float

    @property
    def label(self) -> str:
        if math.isinf(self.min_p_max_w):
            return f"no cap → {self.freq_mhz:g} MHz"
        return f"≥{self.min_p_max_w:g} W → {self.freq_mhz:g} MHz"


@dataclass(frozen=True)
class SensorSpec:
    """What a power sensor needs before one profiled cell's numbers mean something.

    The profiler measures a cell until its steps cover ``min_window_s`` of device time and
    the meter holds ``min_power_samples`` power samples (then until time and power settle,
    ``fl_client.cell_measure.CellWindow``). ``update_period_s`` is how often the sensor's
    reading changes (0: every reading is new, as on an emulated clock): samples taken
    faster repeat a reading, so a backend sets ``min_window_s`` to at least
    ``min_power_samples`` update periods (``fl_client.devices.sensors``, where each
    backend's numbers and their sources are). ``source`` says where the numbers come from.
    """

    name: str  # e.g. "ina3221-sysfs", "jtop", "nvml-average", "twin"
    min_window_s: float = 0.0
    min_power_samples: int = 1
    update_period_s: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        for key, value in (
            ("min-window-s", self.min_window_s),
            ("update-period-s", self.update_period_s),
        ):
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not (ok and math.isfinite(value) and value >= 0):
                raise ValueError(f"{key}: must be a finite number of seconds ≥ 0, got {value!r}")
        n = self.min_power_samples
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"min-power-samples: must be an integer ≥ 1, got {n!r}")

    @property
    def label(self) -> str:
        """``ina3221-sysfs: ≥ 0.5 s and ≥ 10 power samples per cell``."""
        if self.min_window_s == 0 and self.min_power_samples == 1:
            return f"{self.name}: no window needed (one exact reading per step)"
        return (
            f"{self.name}: ≥ {self.min_window_s:g} s and ≥ {self.min_power_samples} power "
            "samples per cell"
        )

    def window_for(self, step_time_s: float, steps: int) -> float:
        """The measured window this sensor needs for a cell whose steps take ``step_time_s``
        each and of which at least ``steps`` are measured: whole steps covering
        ``min_window_s`` (the sample minimum is inside it: ``min_window_s`` spans at least
        ``min_power_samples`` readings at the sampling rate the spec was made for)."""
        if not (math.isfinite(step_time_s) and step_time_s > 0):
            return math.nan
        n = max(int(steps), math.ceil(self.min_window_s / step_time_s - 1e-9), 1)
        return n * step_time_s


#: An emulated clock's sensor: one exact reading per step, no window needed (the digital
#: twin and replay tables report each step's modelled or tabled power as it is).
EXACT_SENSOR = SensorSpec("exact", 0.0, 1, 0.0, "one exact reading per step (emulated clock)")


@dataclass(frozen=True)
class DeviceInfo:
    """What a node tells the server about itself in the QUERY round.

    ``b1_bands`` are B1's safe fixed frequencies per cap band (ascending in both cap and
    frequency; the last is normally the no-cap band), from the device kind's descriptor
    (``configs/devices/<kind>.toml``); empty when no descriptor knows this device.
    ``sensor`` is what this device's power readings need per profiled cell (its window and
    sample minimum); ``board_sensor``, on an emulated device (twin, replay) of a kind with a
    descriptor, is the real board's sensor it stands in for: the profiler records the
    window that board would have needed (``needed-window-s``), as a report only.
    """

    kind: str  # e.g. "jetson-nano"
    backend: str  # "simulated" | "jetson" | "nvml" | "replay"
    knob_values: tuple[float, ...]
    memory_bytes: int
    power_rail: str  # which rail the power readings (and the cap) refer to
    b1_bands: tuple[B1Band, ...] = ()
    sensor: SensorSpec = EXACT_SENSOR
    board_sensor: SensorSpec | None = None

    def __post_init__(self) -> None:
        for band in self.b1_bands:
            if not (band.min_p_max_w > 0 and math.isfinite(band.freq_mhz) and band.freq_mhz > 0):
                raise ValueError(f"b1-freq-caps of {self.kind}: invalid band {band!r}")
        if any(
            b.min_p_max_w <= a.min_p_max_w or b.freq_mhz < a.freq_mhz
            for a, b in itertools.pairwise(self.b1_bands)
        ):
            raise ValueError(
                f"b1-freq-caps of {self.kind}: bands must ascend in min-p-max-w and freq-mhz"
            )

    def profile_floor_mhz(self, caps_w: Iterable[float | None]) -> float:
        """The lowest GPU frequency worth profiling under every cap of ``caps_w``: B1's
        band frequency for the lowest cap. The band is the device's safe fixed frequency
        for the largest b, and a smaller b draws no more at the same clock, so under that
        cap every b's fastest feasible frequency is at or above it. 0.0 (no floor) without
        bands, or when a cap lies below the lowest band."""
        if not self.b1_bands:
            return 0.0
        try:
            return min((self.b1_max_knob_value(w) for w in caps_w), default=0.0)
        except ValueError:
            return 0.0

    def b1_max_knob_value(self, p_max_w: float | None) -> float:
        """B1's fixed GPU frequency in MHz under the cap ``p_max_w`` (inf or None: no cap).

        The band with the largest lower bound ≤ P_max applies, and its frequency is taken
        down to the highest table frequency at or below it (a board's table may differ
        from its descriptor's). A cap below the lowest band has no safe B1 frequency: a
        ValueError, never a silent violation. With no bands known this is the highest table
        frequency, and the log says so once per (kind, backend).
        """
        p = parse_p_max_w(p_max_w)
        if not self.b1_bands:
            if (self.kind, self.backend) not in _NO_BANDS_LOGGED:
                _NO_BANDS_LOGGED.add((self.kind, self.backend))
                log.warning(
                    "B1: no frequency bands known for %s (%s backend; no descriptor "
                    "configs/devices/%s.toml): using its highest frequency, %g MHz",
                    self.kind,
                    self.backend,
                    self.kind,
                    max(self.knob_values),
                )
            return float(max(self.knob_values))
        eligible = [band for band in self.b1_bands if band.min_p_max_w <= p]
        if not eligible:
            bands = ", ".join(b.label for b in self.b1_bands)
            raise ValueError(
                f"p-max-w: {p:g} W is below the lowest B1 band of {self.kind} "
                f"({self.b1_bands[0].min_p_max_w:g} W); B1 has no safe frequency there "
                f"(bands: {bands})"
            )
        band_mhz = eligible[-1].freq_mhz
        below = [f for f in self.knob_values if f <= band_mhz + FREQ_TOLERANCE_MHZ]
        if not below:
            raise ValueError(
                f"b1-freq-caps of {self.kind}: band frequency {band_mhz:g} MHz is below every "
                f"frequency of this device ({', '.join(f'{f:g}' for f in self.knob_values)})"
            )
        return float(max(below))


@dataclass
class Measurement:
    """Device-side accounting of a stretch of work (one profile cell or one local training).

    ``time_s`` is device time (emulated on the twin, wall time on hardware), ``energy_j`` is
    the integral of sampled power over that time, ``peak_power_w`` the highest sample.
    ``cap_violations`` counts the cap guard's steps down (each: power above P_max for the
    guard's window) and ``time_over_cap_s`` the device time spent above P_max; both stay 0
    unless the guard was armed (``fl_client.devices.cap_guard``).
    """

    time_s: float = 0.0
    energy_j: float = 0.0
    peak_power_w: float = 0.0
    steps: int = 0
    samples: int = 0
    power_samples_w: list[float] = field(default_factory=list)
    cap_violations: int = 0
    time_over_cap_s: float = 0.0

    @property
    def avg_power_w(self) -> float:
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0


class Meter(Protocol):
    """Runs training steps on the device and accounts for their time and power."""

    def step(self, batch_size: int, fn: Callable[[], object]) -> None:
        """Run ``fn`` (one real minibatch of ``batch_size`` samples) and account for it."""

    @property
    def measurement(self) -> Measurement:
        """Accounting so far (all figures: may cost time in the number of samples)."""

    @property
    def time_s(self) -> float:
        """Measured time so far; cheap enough to read after every step."""

    def power_samples_since(self, index: int) -> list[float]:
        """This window's power samples from the ``index``-th on (``measurement``'s
        ``power_samples_w[index:]`` while it runs); cheap enough to call after every step:
        its cost is in the samples returned, not in those before ``index``."""


@runtime_checkable
class Device(Protocol):
    """A GPU whose knob (``device_knob``: its frequency, or its power limit) can be set and
    whose power can be read.

    Implementations restore the knob settings they found whatever happens:
    ``restore()`` is idempotent and is also called by ``close()`` and on exit.
    """

    @property
    def info(self) -> DeviceInfo:
        """Descriptor (kind, backend, the knob's values, memory, rail)."""

    @property
    def knob_values(self) -> tuple[float, ...]:
        """The knob's values, ascending: GPU frequencies in MHz, or power limits in W."""

    def current_knob_value(self) -> float:
        """The knob's value now: the frequency the GPU runs at (or is locked to), or the
        power limit in force."""

    def set_knob_value(self, knob_value: float) -> None:
        """Set the knob to ``knob_value`` (must be one of ``knob_values``)."""

    def restore(self) -> None:
        """Put back the knob settings found when the device was opened."""

    def now_s(self) -> float:
        """Device clock in seconds (emulated on the twin)."""

    def measure(self, workload: Workload) -> AbstractContextManager[Meter]:
        """Context manager that accounts for the steps run through its Meter."""

    def close(self) -> None:
        """Restore and release resources."""


def locked(device: Device, knob_value: float) -> AbstractContextManager[Device]:
    """Context manager: set ``device``'s knob to ``knob_value`` and restore on the way out."""
    from contextlib import contextmanager

    @contextmanager
    def _lock() -> Iterator[Device]:
        try:
            device.set_knob_value(knob_value)
            yield device
        finally:
            device.restore()

    return _lock()
