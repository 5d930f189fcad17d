"""The ``nvml`` backend: discrete NVIDIA GPUs through NVML (``pynvml`` from nvidia-ml-py).

Power is the GPU's instantaneous reading (``NVML_FI_DEV_POWER_INSTANT`` through
``nvmlDeviceGetFieldValues``) where the GPU and driver offer it, else
``nvmlDeviceGetPowerUsage``, which on recent data-centre GPUs is an average over about a
second that smooths the short peaks a cap is about (``describe()["power-reading"]`` says
which). Energy comes from the total energy counter (mJ → J, Volta and newer) where the GPU
has one, else from the sampled power.

Locked graphics clocks need root; without them the device runs *measure-only*: its frequency
list is one column, the unlocked clock, labelled with the highest clock the GPU may run at
(never the clock read at open, which on an idle GPU is its idle clock); each profiled cell
records the clock sampled while it ran. Asking for any other frequency is a clear error,
and it never touches the clocks (not even to reset them). The state file is written only once a lock
has succeeded, so a refused lock leaves nothing behind. Restoring resets the locked clocks
(NVML cannot read back an earlier lock, so none is assumed).

``index`` is the GPU as CUDA numbers it in this process (``cuda:index``): through
``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs, abbreviated or not) it is mapped to
the NVML index. Integer entries assume CUDA's order matches NVML's (PCI bus order): set
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` on machines with different GPU models.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from fl_client.devices import safety
from fl_client.devices.base import (
    DeviceError,
    DeviceInfo,
    DevicePermissionError,
    DeviceUnavailableError,
    InvalidFrequencyError,
    level_below,
)
from fl_client.devices.sampler import (
    DEFAULT_CAP_WINDOW_S,
    DEFAULT_SAMPLE_RATE_HZ,
    SampledDevice,
    SensorReadError,
)
from fl_client.devices.sensors import nvml_sensor

log = logging.getLogger(__name__)

BACKEND = "nvml"
POWER_RAIL = "nvml:gpu-board"  # NVML reports the whole board of the GPU
CUDA_VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
_NO_PERMISSION = 4  # NVML_ERROR_NO_PERMISSION
_NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED
#: nvml.h's field id of the instantaneous power (older pynvml releases lack the constant).
NVML_FI_DEV_POWER_INSTANT = 186
#: ``c_nvmlValue_t`` member per ``NVML_VALUE_TYPE_*`` (0 double, 1 unsigned int, ...).
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
PERMISSION_HINT = "run the SuperNode as root (or set lock-clocks = false to measure only)"


def import_pynvml() -> ModuleType:
    """The ``pynvml`` module, or DeviceUnavailableError saying how to install it."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise DeviceUnavailableError(
            "nvml: pynvml is not installed (pip install nvidia-ml-py, or powerfl[nvml])"
        ) from None


def _code(nvml: ModuleType, err: BaseException) -> int | None:
    if not isinstance(err, getattr(nvml, "NVMLError", ())):
        return None
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


class _NoInstantPowerError(Exception):
    """The GPU (or driver, or pynvml) does not report instantaneous power."""


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


class NvmlDevice(SampledDevice):
    """One NVIDIA GPU through NVML: locked clocks when permitted, else measure-only.

    ``index`` is the CUDA device index in this process (mapped through
    ``CUDA_VISIBLE_DEVICES``). ``lock_clocks``: None locks when running as root (else
    measure-only), False is always measure-only (never touches the clocks), True requires
    locking and fails without root.
    """

    def __init__(
        self,
        kind: str = "",
        *,
        index: int = 0,
        lock_clocks: bool | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        sample_rate_hz: float = DEFAULT_SAMPLE_RATE_HZ,
        cap_window_s: float = DEFAULT_CAP_WINDOW_S,
        nvml: ModuleType | None = None,
    ) -> None:
        self._nvml = nv = nvml if nvml is not None else import_pynvml()
        try:
            nv.nvmlInit()
        except Exception as err:
            raise DeviceUnavailableError(
                f"nvml: cannot initialise NVML ({err}); is the NVIDIA driver loaded?"
            ) from None
        try:
            self.cuda_index = index
            self.index = self._nvml_index(index)
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.index)
            self.name = _text(nv.nvmlDeviceGetName(self._handle))
            self.uuid = _text(nv.nvmlDeviceGetUUID(self._handle))
            total_bytes = int(nv.nvmlDeviceGetMemoryInfo(self._handle).total)
            self._supported_mhz = self._supported_clocks_mhz()
            self._has_energy_counter = self._probe_energy_counter()
            self._probed = False
            self.power_reading = self._probe_power_reading()
            self._probed = True
            self._init_sampling(sample_rate_hz, cap_window_s)
            self._locked_mhz: float | None = None
            self._record = safety.GpuStateRecord(state_dir, BACKEND, self.uuid)
            self.measure_only = self._decide_measure_only(lock_clocks)
            self._handle_leftover()
            freqs = (self._unlocked_label_mhz(),) if self.measure_only else self._supported_mhz
        except Exception:
            nv.nvmlShutdown()
            raise
        self._info = DeviceInfo(
            kind=kind or _slug(self.name),
            backend=BACKEND,
            gpu_freqs_mhz=freqs,
            memory_bytes=total_bytes,
            power_rail=POWER_RAIL,
            sensor=nvml_sensor(self.power_reading, self.sample_rate_hz),
        )

    def _unlocked_label_mhz(self) -> float:
        """The column label of a measure-only GPU: the highest clock it may run at (the
        clock an NVIDIA GPU boosts to under load), never the clock read at open, which on
        an idle GPU is its idle clock. Each profiled cell records the clock sampled while it
        ran (the median, ``clock-mhz`` in the LUT)."""
        if self._supported_mhz:
            return max(self._supported_mhz)
        nv = self._nvml
        get_max = getattr(nv, "nvmlDeviceGetMaxClockInfo", None)
        if get_max is not None:
            try:
                return float(get_max(self._handle, nv.NVML_CLOCK_GRAPHICS))
            except Exception as err:
                if _code(nv, err) is None:
                    raise
        log.warning(
            "nvml: %s reports neither its clocks nor its highest clock; its LUT column is the "
            "clock read now (cells still record the clock sampled while they ran)",
            self.name,
        )
        return self.current_gpu_freq_mhz()

    def _call(self, name: str, *args: Any) -> Any:
        """``pynvml.<name>(handle, *args)``; an NVML failure is a SensorReadError naming the
        call and the GPU."""
        try:
            return getattr(self._nvml, name)(self._handle, *args)
        except Exception as err:
            if _code(self._nvml, err) is None and not isinstance(err, OSError):
                raise
            raise SensorReadError(
                f"nvml: {name} failed on {self.name} ({self.uuid}): {err}"
            ) from None

    @property
    def clock_table_mhz(self) -> tuple[float, ...]:
        return self._supported_mhz

    @property
    def clocks_locked(self) -> bool:
        return not self.measure_only

    def _nvml_index(self, cuda_index: int) -> int:
        nv = self._nvml
        count = int(nv.nvmlDeviceGetCount())
        visible = os.environ.get(CUDA_VISIBLE_ENV)
        if visible is None:  # only the count matters
            return cuda_to_nvml_index(cuda_index, None, [""] * count)
        uuids = [
            _text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))) for i in range(count)
        ]
        return cuda_to_nvml_index(cuda_index, visible, uuids)

    def _decide_measure_only(self, lock_clocks: bool | None) -> bool:
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        if lock_clocks and not is_root:
            raise DevicePermissionError(
                "nvml: locking GPU clocks needs root; run the SuperNode as root, or set "
                "lock-clocks = false to measure only"
            )
        want = is_root if lock_clocks is None else lock_clocks
        if want and self._supported_mhz:
            return False
        why = "lock-clocks = false" if lock_clocks is False else "not root or no clock list"
        log.info("nvml: %s is measure-only (%s)", self.name, why)
        return True

    def _handle_leftover(self) -> None:
        """Reset clocks a killed run left locked; measure-only mode never touches them."""
        try:
            state = self._record.leftover()
        except DeviceError as err:  # a live process holds the GPU's clocks
            if not self.measure_only:
                raise
            log.warning("%s; measuring only, the clocks stay as they are", err)
            return
        if state is None or state.pid == os.getpid():  # none, or held by this process
            return
        if self.measure_only:
            log.warning(
                "nvml: a killed run may have left the clocks of %s locked (state file %s); "
                "measure-only leaves them as they are: as root, run `powerfl devices --restore`",
                self.name,
                self._record.path,
            )
            return
        self._reset_clocks()
        safety.clear_state(self._record.path)
        log.warning("nvml: reset the locked clocks a killed run left on %s", self.name)

    def _supported_clocks_mhz(self) -> tuple[float, ...]:
        nv, h = self._nvml, self._handle
        try:
            mem_mhz = max(int(m) for m in nv.nvmlDeviceGetSupportedMemoryClocks(h))
            gpu_mhz = nv.nvmlDeviceGetSupportedGraphicsClocks(h, mem_mhz)
        except Exception as err:
            if _code(nv, err) is None:
                raise
            log.info("nvml: supported clocks not reported (%s)", err)
            return ()
        return tuple(sorted({float(f) for f in gpu_mhz}))

    def _probe_energy_counter(self) -> bool:
        try:
            self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except Exception as err:
            if _code(self._nvml, err) is None:
                raise
            return False
        return True

    def _probe_power_reading(self) -> str:
        """``instant`` where the GPU reports instantaneous power, else ``average``."""
        try:
            self._read_instant_power_mw()
        except _NoInstantPowerError as err:
            log.info("nvml: no instantaneous power on %s (%s): ~1 s averages", self.name, err)
            return "average"
        return "instant"

    def _read_instant_power_mw(self) -> float:
        nv = self._nvml
        get_values = getattr(nv, "nvmlDeviceGetFieldValues", None)
        if get_values is None:
            raise _NoInstantPowerError("pynvml has no nvmlDeviceGetFieldValues")
        field_id = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", NVML_FI_DEV_POWER_INSTANT)
        try:
            value = get_values(self._handle, [field_id])[0]
        except Exception as err:
            code = _code(nv, err)
            if code is None:
                raise
            if code != _NOT_SUPPORTED and self._probed:
                raise  # a failure mid-run, not a GPU without the field
            raise _NoInstantPowerError(str(err)) from None
        if value.nvmlReturn != 0:
            raise _NoInstantPowerError(f"NVML error {value.nvmlReturn}")
        if not 0 <= value.valueType < len(_VALUE_MEMBERS):
            raise _NoInstantPowerError(f"unknown value type {value.valueType}")
        return float(getattr(value.value, _VALUE_MEMBERS[value.valueType]))

    @property
    def has_energy_counter(self) -> bool:
        return self._has_energy_counter

    def current_gpu_freq_mhz(self) -> float:
        return float(self._call("nvmlDeviceGetClockInfo", self._nvml.NVML_CLOCK_GRAPHICS))

    def set_gpu_freq_mhz(self, freq_mhz: float) -> None:
        match = next((f for f in self.gpu_freqs_mhz if abs(f - freq_mhz) < 1e-3), None)
        if match is None:
            if self.measure_only:
                raise InvalidFrequencyError(
                    f"gpu-freq-mhz: {self.name} is measure-only (locking clocks needs root "
                    f"and lock-clocks not false); its only column is its unlocked clock, "
                    f"labelled {self.gpu_freqs_mhz[0]:g} MHz (its highest), not {freq_mhz:g} MHz"
                )
            raise InvalidFrequencyError(
                f"gpu-freq-mhz: {freq_mhz:g} MHz is not a supported clock of {self.name}; "
                f"allowed: {', '.join(f'{f:g}' for f in self.gpu_freqs_mhz)}"
            )
        if self.measure_only:
            return  # the unlocked clock: nothing to change
        with self._lock:
            self._lock_mhz(match)

    def _lock_mhz(self, freq_mhz: float) -> None:
        """Lock, then (first lock only) save the state: a refused lock leaves no file."""
        nv = self._nvml
        try:
            nv.nvmlDeviceSetGpuLockedClocks(self._handle, int(freq_mhz), int(freq_mhz))
        except Exception as err:
            code = _code(nv, err)
            if code is None:
                raise
            self._restore_after_failed_lock()
            if code == _NO_PERMISSION:
                raise DevicePermissionError(
                    f"nvml: no permission to lock the clocks of {self.name}: {PERMISSION_HINT}"
                ) from None
            raise DeviceError(
                f"nvml: locking {self.name} at {freq_mhz:g} MHz failed: {err}"
            ) from None
        if not self._record.active:
            try:
                self._record.begin({"uuid": self.uuid, "index": self.index}, self.restore)
            except DeviceError:  # the original state cannot be saved: undo the lock
                self._reset_logging_failure("undoing a lock whose state could not be saved")
                raise
        self._locked_mhz = freq_mhz

    def _restore_after_failed_lock(self) -> None:
        """After a refused lock: put back an earlier lock of ours, if any (else nothing)."""
        if not self._record.active:
            return
        try:
            self.restore()
        except DeviceError as err:
            log.error(
                "nvml: restoring %s after a failed lock also failed (%s); as root, run "
                "`powerfl devices --restore`",
                self.name,
                err,
            )

    def _reset_logging_failure(self, why: str) -> None:
        try:
            self._reset_clocks()
        except DeviceError as err:
            log.error("nvml: %s: %s", why, err)

    def step_down_gpu_freq_mhz(self) -> float | None:
        with self._lock:
            lower = level_below(self.gpu_freqs_mhz, self._locked_mhz)
            if lower is not None:
                self._lock_mhz(lower)
            return lower

    def _reset_clocks(self) -> None:
        try:
            self._nvml.nvmlDeviceResetGpuLockedClocks(self._handle)
        except Exception as err:
            code = _code(self._nvml, err)
            if code is None:
                raise
            if code == _NO_PERMISSION:
                raise DevicePermissionError(
                    f"nvml: no permission to reset the locked clocks of {self.name}: "
                    f"{PERMISSION_HINT}"
                ) from None
            raise DeviceError(
                f"nvml: resetting the locked clocks of {self.name} failed: {err}"
            ) from None

    def restore(self) -> None:
        with self._lock:
            if not self._record.active:
                return
            self._reset_clocks()
            self._record.end()
            self._locked_mhz = None

    def read_power_w(self) -> float:
        """Instantaneous power where the GPU reports it (else NVML's ~1 s average), in W."""
        if self.power_reading == "instant":
            try:
                return self._read_instant_power_mw() / 1000.0
            except _NoInstantPowerError:
                pass  # a transient refusal: this one sample is the average
            except Exception as err:
                if _code(self._nvml, err) is None:
                    raise
                raise SensorReadError(
                    f"nvml: nvmlDeviceGetFieldValues failed on {self.name} ({self.uuid}): {err}"
                ) from None
        return float(self._call("nvmlDeviceGetPowerUsage")) / 1000.0

    def read_energy_j(self) -> float:
        """The GPU's total energy counter since driver load, in joules."""
        return float(self._call("nvmlDeviceGetTotalEnergyConsumption")) / 1000.0

    def energy_counter_j(self) -> Callable[[], float] | None:
        return self.read_energy_j if self._has_energy_counter else None

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self._info.kind,
            "backend": BACKEND,
            "name": self.name,
            "uuid": self.uuid,
            "index": self.index,
            "cuda-index": self.cuda_index,
            "mode": "measure-only" if self.measure_only else "locked clocks",
            "gpu-freqs-mhz": list(self.gpu_freqs_mhz),
            "supported-clocks-mhz": list(self._supported_mhz),
            "cur-freq-mhz": self.current_gpu_freq_mhz(),
            "memory-bytes": self._info.memory_bytes,
            "power-rail": POWER_RAIL,
            "power-reading": self.power_reading,
            "power-sensor": self._info.sensor.label,
            "power-w": self.read_power_w(),
            "energy-counter": self._has_energy_counter,
            "state-file": str(self._record.path),
        }

    def _release(self) -> None:
        self._nvml.nvmlShutdown()


def restore_saved_settings(settings: Mapping[str, Any], nvml: ModuleType | None = None) -> None:
    """Reset the locked clocks of the GPU named in a state file (``--restore``)."""
    nv = nvml if nvml is not None else import_pynvml()
    nv.nvmlInit()
    try:
        handle = nv.nvmlDeviceGetHandleByUUID(str(settings["uuid"]))
        nv.nvmlDeviceResetGpuLockedClocks(handle)
    except Exception as err:
        if _code(nv, err) is None:
            raise
        raise DeviceError(
            f"nvml: resetting clocks of GPU {settings['uuid']} failed: {err}"
        ) from None
    finally:
        nv.nvmlShutdown()


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
        if _code(nv, err) is None:
            raise
        raise DeviceUnavailableError(f"nvml: cannot count GPUs ({err})") from None
    finally:
        nv.nvmlShutdown()
