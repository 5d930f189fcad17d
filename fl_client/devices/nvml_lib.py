"""NVML, the library: importing ``pynvml``, its error codes and strings, CUDA's numbering of
the GPUs mapped to NVML's, putting back the settings a state file saved, counting GPUs.

What the ``nvml`` backend (``fl_client.devices.nvml``) needs of NVML beyond one device's
calls; every function takes the ``pynvml`` module, so tests pass a fake one.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from fl_client.devices.base import DeviceError, DevicePermissionError, DeviceUnavailableError

CUDA_VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
NO_PERMISSION = 4  # NVML_ERROR_NO_PERMISSION
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
PERMISSION_HINT = "run the SuperNode as root (or set lock-clocks = false to measure only)"
#: The state file's key of the power limit found before the first change (mW, as NVML).
SAVED_LIMIT_KEY = "power-limit-mw"


def mw_to_w(mw: object) -> float:
    return float(mw) / 1000.0  # type: ignore[arg-type]


def put_back(nv: ModuleType, handle: Any, settings: Mapping[str, Any], name: str) -> None:
    """Put back what a state file saved: the power limit it holds, else reset the clocks
    (NVML cannot read back an earlier lock). DeviceError (permission: DevicePermissionError)
    naming the GPU and what failed."""
    if SAVED_LIMIT_KEY in settings:
        mw = int(settings[SAVED_LIMIT_KEY])
        what = f"restore the power limit of {name} to {mw / 1000:g} W"

        def call() -> None:
            nv.nvmlDeviceSetPowerManagementLimit(handle, mw)
    else:
        what = f"reset the locked clocks of {name}"

        def call() -> None:
            nv.nvmlDeviceResetGpuLockedClocks(handle)

    try:
        call()
    except Exception as err:
        code = nvml_error_code(nv, err)
        if code is None:
            raise
        if code == NO_PERMISSION:
            raise DevicePermissionError(
                f"nvml: no permission to {what}: {PERMISSION_HINT}"
            ) from None
        raise DeviceError(f"nvml: could not {what}: {err}") from None


def import_pynvml() -> ModuleType:
    """The ``pynvml`` module, or DeviceUnavailableError saying how to install it."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise DeviceUnavailableError(
            "nvml: pynvml is not installed (pip install nvidia-ml-py, or powerfl[nvml])"
        ) from None


def nvml_error_code(nvml: ModuleType, err: BaseException) -> int | None:
    if not isinstance(err, getattr(nvml, "NVMLError", ())):
        return None
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def nvml_text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _visible_entries(visible: str) -> list[str]:
    """CUDA's parse of CUDA_VISIBLE_DEVICES: the list ends at the first invalid entry."""
    entries = []
    for raw in visible.split(","):
        entry = raw.strip()
        is_index = entry.isdigit()
        if not (is_index or entry.upper().startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    return entries


def cuda_to_nvml_index(index: int, visible: str | None, uuids: Sequence[str]) -> int:
    """The NVML index of the GPU this process calls ``cuda:index``.

    ``visible`` is ``CUDA_VISIBLE_DEVICES`` (None: unset, every GPU visible in NVML's
    order); ``uuids`` are the GPUs' UUIDs in NVML order. Entries are NVML indices or
    ``GPU-`` UUIDs, abbreviated to any unique prefix as CUDA allows.
    """
    if index < 0:
        raise DeviceUnavailableError(f"nvml-index: must be ≥ 0, got {index}")
    if visible is None:
        if index >= len(uuids):
            raise DeviceUnavailableError(
                f"nvml-index: GPU {index} does not exist; this machine has {len(uuids)} GPU(s)"
            )
        return index
    entries = _visible_entries(visible)
    if index >= len(entries):
        raise DeviceUnavailableError(
            f"nvml-index: {CUDA_VISIBLE_ENV}={visible!r} makes {len(entries)} GPU(s) "
            f"visible, so there is no cuda:{index}"
        )
    entry = entries[index]
    where = f"{CUDA_VISIBLE_ENV}={visible!r}, entry {entry!r}"
    if entry.isdigit():
        if int(entry) >= len(uuids):
            raise DeviceUnavailableError(
                f"nvml-index: {where}: this machine has {len(uuids)} GPU(s)"
            )
        return int(entry)
    if entry.upper().startswith("MIG-"):
        raise DeviceUnavailableError(
            f"nvml-index: {where} is a MIG instance; NVML power and clocks are per GPU, so "
            "the nvml backend needs a whole GPU"
        )
    matches = [i for i, u in enumerate(uuids) if u.lower().startswith(entry.lower())]
    if len(matches) != 1:
        what = "no GPU" if not matches else f"{len(matches)} GPUs"
        raise DeviceUnavailableError(
            f"nvml-index: {where} matches {what}; GPUs here: {', '.join(uuids) or '(none)'}"
        )
    return matches[0]


def gpu_count(nvml: ModuleType | None = None) -> int:
    """How many GPUs NVML sees (DeviceUnavailableError when it cannot be used)."""
    nv = nvml if nvml is not None else import_pynvml()
    try:
        nv.nvmlInit()
    except Exception as err:
        raise DeviceUnavailableError(f"nvml: cannot initialise NVML ({err})") from None
    try:
        return int(nv.nvmlDeviceGetCount())
    except Exception as err:
        if nvml_error_code(nv, err) is None:
            raise
        raise DeviceUnavailableError(f"nvml: cannot count GPUs ({err})") from None
    finally:
        nv.nvmlShutdown()
