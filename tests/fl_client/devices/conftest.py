"""Fixtures of the device tests: an isolated state folder and a fake ``pynvml`` module."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fl_client.devices import safety


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own GPU state folder; nothing reaches ~/.cache or stays active."""
    folder = tmp_path / "powerfl-state"
    monkeypatch.setenv(safety.STATE_DIR_ENV, str(folder))
    yield folder
    with safety._lock:
        safety._active.clear()
    safety.uninstall_handlers()


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    """What the fake NVML reports for one GPU, and what it was asked to do."""

    name: Any = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-1111-2222-3333-444444444444"
    memory_total: int = 85_520_809_984
    mem_clocks_mhz: tuple[int, ...] = (2619, 1593)
    graphics_clocks_mhz: tuple[int, ...] = (1980, 1965, 1410, 1005, 345)
    clock_mhz: int = 1755
    power_mw: int = 123_456
    energy_mj: int = 5_000_000
    energy_step_mj: int = 250  # counter increase per read
    energy_supported: bool = True
    clocks_supported: bool = True
    lock_error: int | None = None
    locked: tuple[int, int] | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)


def make_fake_pynvml(gpu: FakeGpu) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError  # type: ignore[attr-defined]
    nv.NVML_ERROR_NOT_SUPPORTED = 3  # type: ignore[attr-defined]
    nv.NVML_ERROR_NO_PERMISSION = 4  # type: ignore[attr-defined]
    nv.NVML_CLOCK_GRAPHICS = 0  # type: ignore[attr-defined]
    handle = object()

    def call(name: str, *args: Any) -> None:
        gpu.calls.append((name, args))

    def init() -> None:
        call("nvmlInit")

    def shutdown() -> None:
        call("nvmlShutdown")

    def handle_by_index(i: int) -> object:
        return handle

    def handle_by_uuid(uuid: str) -> object:
        if uuid != gpu.uuid:
            raise NVMLError(13)
        return handle

    def memory_info(h: object) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=gpu.memory_total, used=0, free=gpu.memory_total)

    def mem_clocks(h: object) -> list[int]:
        if not gpu.clocks_supported:
            raise NVMLError(3)
        return list(gpu.mem_clocks_mhz)

    def graphics_clocks(h: object, mem_mhz: int) -> list[int]:
        assert mem_mhz == max(gpu.mem_clocks_mhz)
        return list(gpu.graphics_clocks_mhz)

    def clock_info(h: object, kind: int) -> int:
        assert kind == 0
        return gpu.locked[0] if gpu.locked else gpu.clock_mhz

    def power_usage(h: object) -> int:
        return gpu.power_mw

    def energy(h: object) -> int:
        if not gpu.energy_supported:
            raise NVMLError(3)
        gpu.energy_mj += gpu.energy_step_mj
        return gpu.energy_mj

    def set_locked(h: object, lo: int, hi: int) -> None:
        call("nvmlDeviceSetGpuLockedClocks", lo, hi)
        if gpu.lock_error is not None:
            raise NVMLError(gpu.lock_error)
        gpu.locked = (lo, hi)

    def reset_locked(h: object) -> None:
        call("nvmlDeviceResetGpuLockedClocks")
        gpu.locked = None

    for name, fn in {
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": handle_by_index,
        "nvmlDeviceGetHandleByUUID": handle_by_uuid,
        "nvmlDeviceGetName": lambda h: gpu.name,
        "nvmlDeviceGetUUID": lambda h: gpu.uuid,
        "nvmlDeviceGetMemoryInfo": memory_info,
        "nvmlDeviceGetSupportedMemoryClocks": mem_clocks,
        "nvmlDeviceGetSupportedGraphicsClocks": graphics_clocks,
        "nvmlDeviceGetClockInfo": clock_info,
        "nvmlDeviceGetPowerUsage": power_usage,
        "nvmlDeviceGetTotalEnergyConsumption": energy,
        "nvmlDeviceSetGpuLockedClocks": set_locked,
        "nvmlDeviceResetGpuLockedClocks": reset_locked,
    }.items():
        setattr(nv, name, fn)
    return nv


@pytest.fixture
def fake_gpu() -> FakeGpu:
    return FakeGpu()


@pytest.fixture
def fake_pynvml(fake_gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A fake ``pynvml`` installed in ``sys.modules`` (never a real GPU's clocks)."""
    module = make_fake_pynvml(fake_gpu)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


@pytest.fixture
def no_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import pynvml`` fails, as on a machine without nvidia-ml-py."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


@pytest.fixture
def as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)


@pytest.fixture
def not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
