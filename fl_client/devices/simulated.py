"""Digital twins of Jetson boards: real frequency tables, a time and a power model, noise.

A twin (``SimulatedDevice``) implements the ``Device`` protocol without hardware: every
training step's ``fn`` runs for real on the host (the model really trains), and the step's
device time, power and energy come from the model below at the locked GPU frequency, on an
emulated clock. Each board is described by ``configs/devices/<kind>.toml`` (``DeviceSpec``,
read by ``fl_client.devices.descriptors``); the model is pure functions of (spec, b, f,
FLOPs per sample) so the selector, benchmarks and tests can use it without a device.

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

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from fl_client.devices.base import Workload, level_below
from fl_client.devices.descriptors import TWIN_BACKEND, DeviceSpec, load_device_spec
from fl_client.devices.emulated import EmulatedDevice, EmulatedMeter
from fl_client.devices.guard import CapGuard

#: FLOPs per sample the parallel-work term is relative to (1 GFLOP).
REF_FLOPS = 1e9
#: Multiplicative noise is a normal draw clipped at this many standard deviations.
NOISE_CLIP_SIGMA = 3.0


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
        _check_inputs(batch_size, self._twin.current_knob_value(), self._flops)
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

    def current_knob_value(self) -> float:
        return self._freq_mhz

    def set_knob_value(self, freq_mhz: float) -> None:
        self._freq_mhz = self.knob_values[self._spec.freq_index(float(freq_mhz))]

    def restore(self) -> None:
        """Back to the default (the highest frequency, as the governor would run it)."""
        self._freq_mhz = self._spec.max_freq_mhz

    def step_down_knob_value(self) -> float | None:
        """Go one table level below the current frequency (the cap guard's move).

        Returns the new frequency, or None when already at the lowest.
        """
        lower = level_below(self.knob_values, self._freq_mhz)
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
            "backend": TWIN_BACKEND,
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
