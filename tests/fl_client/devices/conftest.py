"""Fixtures of the device tests: an isolated state folder and a fake ``pynvml`` module."""

from __future__ import annotations

import select
import subprocess
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
    instant_power_mw: int | None = None  # None: NVML_FI_DEV_POWER_INSTANT not supported
    energy_mj: int = 5_000_000
    energy_step_mj: int = 250  # counter increase per read
    energy_supported: bool = True
    clocks_supported: bool = True
    lock_error: int | None = None
    reset_error: int | None = None  # e.g. 4: the driver refuses the reset too
    locked: tuple[int, int] | None = None
    power_limit_mw: int = 700_000  # the limit in force (an H100 SXM's default: 700 W)
    power_limit_range_mw: tuple[int, int] | None = (200_000, 700_000)  # None: not supported
    power_limit_default_mw: int = 700_000
    limit_error: int | None = None  # e.g. 4: setting the limit is refused
    calls: list[tuple[str, Any]] = field(default_factory=list)


FI_DEV_POWER_INSTANT = 186


def _field_value(gpu: FakeGpu, field_id: int) -> types.SimpleNamespace:
    """One ``c_nvmlFieldValue_t`` as pynvml returns it (value type 1: unsigned int)."""
    ok = field_id == FI_DEV_POWER_INSTANT and gpu.instant_power_mw is not None
    return types.SimpleNamespace(
        fieldId=field_id,
        scopeId=0,
        nvmlReturn=0 if ok else 3,
        valueType=1,
        value=types.SimpleNamespace(uiVal=gpu.instant_power_mw if ok else 0),
    )


def pynvml_module() -> types.ModuleType:
    """An empty fake ``pynvml`` with the error type and the constants ``NvmlDevice`` reads;
    the fakes add their device calls to it."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError  # type: ignore[attr-defined]
    nv.NVML_ERROR_NOT_SUPPORTED = 3  # type: ignore[attr-defined]
    nv.NVML_ERROR_NO_PERMISSION = 4  # type: ignore[attr-defined]
    nv.NVML_CLOCK_GRAPHICS = 0  # type: ignore[attr-defined]
    nv.NVML_FI_DEV_POWER_INSTANT = FI_DEV_POWER_INSTANT  # type: ignore[attr-defined]
    return nv


def make_fake_pynvml(*gpus: FakeGpu) -> types.ModuleType:
    """A fake ``pynvml`` over ``gpus`` in NVML order; a handle is the FakeGpu itself.

    Module-level calls (init, shutdown) are recorded on the first GPU.
    """
    nv = pynvml_module()
    first = gpus[0]

    def handle_by_index(i: int) -> FakeGpu:
        if not 0 <= i < len(gpus):
            raise NVMLError(2)
        return gpus[i]

    def handle_by_uuid(uuid: str) -> FakeGpu:
        for gpu in gpus:
            if uuid == gpu.uuid:
                return gpu
        raise NVMLError(13)

    def memory_info(h: FakeGpu) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=h.memory_total, used=0, free=h.memory_total)

    def mem_clocks(h: FakeGpu) -> list[int]:
        if not h.clocks_supported:
            raise NVMLError(3)
        return list(h.mem_clocks_mhz)

    def graphics_clocks(h: FakeGpu, mem_mhz: int) -> list[int]:
        assert mem_mhz == max(h.mem_clocks_mhz)
        return list(h.graphics_clocks_mhz)

    def clock_info(h: FakeGpu, kind: int) -> int:
        assert kind == 0
        return h.locked[0] if h.locked else h.clock_mhz

    def energy(h: FakeGpu) -> int:
        if not h.energy_supported:
            raise NVMLError(3)
        h.energy_mj += h.energy_step_mj
        return h.energy_mj

    def set_locked(h: FakeGpu, lo: int, hi: int) -> None:
        h.calls.append(("nvmlDeviceSetGpuLockedClocks", (lo, hi)))
        if h.lock_error is not None:
            raise NVMLError(h.lock_error)
        h.locked = (lo, hi)

    def reset_locked(h: FakeGpu) -> None:
        h.calls.append(("nvmlDeviceResetGpuLockedClocks", ()))
        if h.reset_error is not None:
            raise NVMLError(h.reset_error)
        h.locked = None

    def limit_range(h: FakeGpu) -> tuple[int, int]:
        if h.power_limit_range_mw is None:
            raise NVMLError(3)
        return h.power_limit_range_mw

    def set_limit(h: FakeGpu, mw: int) -> None:
        """As the driver: NO_PERMISSION when refused, INVALID_ARGUMENT (2) out of range."""
        h.calls.append(("nvmlDeviceSetPowerManagementLimit", mw))
        if h.limit_error is not None:
            raise NVMLError(h.limit_error)
        lo, hi = h.power_limit_range_mw or (0, 0)
        if not lo <= mw <= hi:
            raise NVMLError(2)
        h.power_limit_mw = int(mw)

    for name, fn in {
        "nvmlInit": lambda: first.calls.append(("nvmlInit", ())),
        "nvmlShutdown": lambda: first.calls.append(("nvmlShutdown", ())),
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": handle_by_index,
        "nvmlDeviceGetHandleByUUID": handle_by_uuid,
        "nvmlDeviceGetName": lambda h: h.name,
        "nvmlDeviceGetUUID": lambda h: h.uuid,
        "nvmlDeviceGetMemoryInfo": memory_info,
        "nvmlDeviceGetSupportedMemoryClocks": mem_clocks,
        "nvmlDeviceGetSupportedGraphicsClocks": graphics_clocks,
        "nvmlDeviceGetClockInfo": clock_info,
        "nvmlDeviceGetPowerUsage": lambda h: h.power_mw,
        "nvmlDeviceGetFieldValues": lambda h, ids: [_field_value(h, i) for i in ids],
        "nvmlDeviceGetTotalEnergyConsumption": energy,
        "nvmlDeviceSetGpuLockedClocks": set_locked,
        "nvmlDeviceResetGpuLockedClocks": reset_locked,
        "nvmlDeviceGetPowerManagementLimit": lambda h: h.power_limit_mw,
        "nvmlDeviceGetPowerManagementLimitConstraints": limit_range,
        "nvmlDeviceGetPowerManagementDefaultLimit": lambda h: h.power_limit_default_mw,
        "nvmlDeviceSetPowerManagementLimit": set_limit,
    }.items():
        setattr(nv, name, fn)
    return nv


@pytest.fixture
def fake_gpu() -> FakeGpu:
    return FakeGpu()


@pytest.fixture
def fake_pynvml(fake_gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A fake ``pynvml`` installed in ``sys.modules`` (never a real GPU's clocks).

    ``CUDA_VISIBLE_DEVICES`` is unset so the index is NVML's, whatever the host sets.
    """
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
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


def await_line(proc: subprocess.Popen[str], marker: str, timeout_s: float, what: str) -> None:
    """Wait up to ``timeout_s`` for the child's first line of output to be ``marker``; else
    kill it and fail the test with ``what``, the line and the child's stderr."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != marker:
        proc.kill()
        pytest.fail(f"{what}: {line!r} {proc.communicate()[1]}")
