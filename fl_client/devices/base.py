"""The one Device protocol that every backend (twin, Jetson, NVML, replay) implements."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class DeviceError(RuntimeError):
    """Base class of every error a device backend raises; messages say what to do."""


class DeviceUnavailableError(DeviceError):
    """The backend cannot run here (library missing, no such hardware)."""


class DevicePermissionError(DeviceError):
    """The backend found the hardware but may not change it (e.g. not root)."""


class InvalidFrequencyError(DeviceError, ValueError):
    """A frequency that is not in the device's table was requested."""


@dataclass(frozen=True)
class Workload:
    """What a device is asked to run: one model at one input shape.

    ``flops_per_sample`` counts forward plus backward FLOPs of one training sample
    (see ``fl_client.task.train_flops_per_sample``); the digital twin turns it into time
    and power, real backends ignore it and measure.
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
class DeviceInfo:
    """What a node tells the server about itself in the QUERY round."""

    kind: str  # e.g. "jetson-nano"
    backend: str  # "simulated" | "jetson" | "nvml" | "replay"
    gpu_freqs_mhz: tuple[float, ...]
    memory_bytes: int
    power_rail: str  # which rail the power readings (and the cap) refer to


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
        """Accounting so far."""


@runtime_checkable
class Device(Protocol):
    """A GPU whose frequency can be locked and whose power can be read.

    Implementations restore the frequency settings they found whatever happens:
    ``restore()`` is idempotent and is also called by ``close()`` and on exit.
    """

    @property
    def info(self) -> DeviceInfo:
        """Descriptor (kind, backend, frequency table, memory, rail)."""

    @property
    def gpu_freqs_mhz(self) -> tuple[float, ...]:
        """Available GPU frequencies in MHz, ascending."""

    def current_gpu_freq_mhz(self) -> float:
        """The frequency the GPU runs at (or is locked to) now."""

    def set_gpu_freq_mhz(self, freq_mhz: float) -> None:
        """Lock the GPU at ``freq_mhz`` (must be one of ``gpu_freqs_mhz``)."""

    def restore(self) -> None:
        """Put back the frequency settings found when the device was opened."""

    def now_s(self) -> float:
        """Device clock in seconds (emulated on the twin)."""

    def measure(self, workload: Workload) -> AbstractContextManager[Meter]:
        """Context manager that accounts for the steps run through its Meter."""

    def close(self) -> None:
        """Restore and release resources."""


def locked(device: Device, freq_mhz: float) -> AbstractContextManager[Device]:
    """Context manager: lock ``device`` at ``freq_mhz`` and restore on the way out."""
    from contextlib import contextmanager

    @contextmanager
    def _lock() -> Iterator[Device]:
        try:
            device.set_gpu_freq_mhz(freq_mhz)
            yield device
        finally:
            device.restore()

    return _lock()
