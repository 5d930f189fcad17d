"""Device backends behind one protocol, and the factory that opens one."""

from __future__ import annotations

from fl_client.devices.base import (
    Device,
    DeviceError,
    DeviceInfo,
    DevicePermissionError,
    DeviceUnavailableError,
    InvalidFrequencyError,
    Measurement,
    Meter,
    Workload,
    locked,
)

BACKENDS = ("auto", "simulated", "jetson", "nvml", "replay")


def open_device(kind: str, backend: str = "simulated", *, seed: int = 0) -> Device:
    """Open the device ``kind`` through ``backend``.

    ``kind`` names a descriptor in ``configs/devices`` (e.g. ``jetson-nano``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if backend == "simulated":
        from fl_client.devices.simulated import SimulatedDevice, load_device_spec

        return SimulatedDevice(load_device_spec(kind), seed=seed)
    raise DeviceUnavailableError(f"backend: {backend!r} is not available in this build")


__all__ = [
    "BACKENDS",
    "Device",
    "DeviceError",
    "DeviceInfo",
    "DevicePermissionError",
    "DeviceUnavailableError",
    "InvalidFrequencyError",
    "Measurement",
    "Meter",
    "Workload",
    "locked",
    "open_device",
]
