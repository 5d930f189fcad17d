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

**The power-limit knob** (``knob = "power-limit"``, or ``auto`` on a GPU whose clocks cannot
be locked): the grid's columns are GPU power limits in W instead of clocks, as Zeus selects
them: from the GPU's highest allowed limit down in steps of ``power-limit-step-w`` to its
lowest (``nvmlDeviceGetPowerManagementLimitConstraints``), each set with
``nvmlDeviceSetPowerManagementLimit`` (root). A limit outside that range is refused before
anything changes, naming the range. The limit in force before the first change
(``nvmlDeviceGetPowerManagementLimit``) is written to the state file *before* the change, and
put back on every exit path (``restore``, ``close``, exceptions, SIGTERM/SIGINT/SIGHUP, and
after SIGKILL at the next open or ``powerfl devices --restore``). A restore that fails is an
error and leaves the state file. The clocks are never locked in this mode: each cell records
the clock sampled while it ran.

``index`` is the GPU as CUDA numbers it in this process (``cuda:index``): through
``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUIDs, abbreviated or not) it is mapped to
the NVML index. Integer entries assume CUDA's order matches NVML's (PCI bus order): set
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` on machines with different GPU models.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fl_client.devices import safety
from fl_client.devices.base import (
    GPU_FREQ_MHZ,
    GPU_POWER_LIMIT_W,
    DeviceError,
    DeviceInfo,
    DevicePermissionError,
    DeviceUnavailableError,
    InvalidFrequencyError,
    Knob,
    check_knob_setting,
    level_below,
)
from fl_client.devices.nvml_lib import (
    CUDA_VISIBLE_ENV,
    NO_PERMISSION,
    NOT_SUPPORTED,
    PERMISSION_HINT,
    SAVED_LIMIT_KEY,
    cuda_to_nvml_index,
    import_pynvml,
    mw_to_w,
    nvml_error_code,
    nvml_text,
    put_back,
)
from fl_client.devices.sampler import SampledDevice, SampledOptions, SensorReadError
from fl_client.devices.sensors import nvml_sensor

log = logging.getLogger(__name__)

BACKEND = "nvml"
POWER_RAIL = "nvml:gpu-board"  # NVML reports the whole board of the GPU
#: nvml.h's field id of the instantaneous power (older pynvml releases lack the constant).
NVML_FI_DEV_POWER_INSTANT = 186
#: ``c_nvmlValue_t`` member per ``NVML_VALUE_TYPE_*`` (0 double, 1 unsigned int, ...).
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
#: The power-limit grid's default step in W (Zeus's power-limit optimizer steps by 25 W).
DEFAULT_POWER_LIMIT_STEP_W = 25.0


def power_limit_grid_w(min_w: float, max_w: float, step_w: float) -> tuple[float, ...]:
    """The power limits profiled, ascending: from ``max_w`` down by ``step_w`` to ``min_w``
    (both ends included; the lowest step may be shorter). ValueError naming
    ``power-limit-step-w`` for a step that is not a positive number of W."""
    ok = isinstance(step_w, int | float) and not isinstance(step_w, bool)
    if not (ok and math.isfinite(step_w) and step_w > 0):
        raise ValueError(f"power-limit-step-w: must be a number of W > 0, got {step_w!r}")
    if not (0 < min_w <= max_w):
        raise ValueError(f"power limit range: expected 0 < min ≤ max, got {min_w:g}–{max_w:g} W")
    values = []
    w = max_w
    while w > min_w + 1e-6:
        values.append(round(w, 3))
        w -= step_w
    values.append(round(min_w, 3))
    return tuple(sorted(set(values)))


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


class _NoInstantPowerError(Exception):
    """The GPU (or driver, or pynvml) does not report instantaneous power."""


@dataclass(frozen=True)
class NvmlControl:
    """What the nvml backend may change on the GPU, and how.

    ``lock_clocks``: None changes the GPU's settings when running as root (else
    measure-only), False is always measure-only (never touches the clocks or the power
    limit), True requires root and fails without it. ``knob``: ``frequency`` (locked
    clocks), ``power-limit`` (power limits from the GPU's range in steps of
    ``power_limit_step_w``; needs root) or ``auto`` (locked clocks where the GPU lists its
    clocks, else power limits, when root).
    """

    lock_clocks: bool | None = None
    knob: str = GPU_FREQ_MHZ.setting
    power_limit_step_w: float = DEFAULT_POWER_LIMIT_STEP_W


class NvmlDevice(SampledDevice):
    """One NVIDIA GPU through NVML: locked clocks or power limits when permitted, else
    measure-only.

    ``index`` is the CUDA device index in this process (mapped through
    ``CUDA_VISIBLE_DEVICES``); ``control``: what may be changed on the GPU (``NvmlControl``);
    ``sampled``: the sampling rate, the cap guard's window and the state folder; ``nvml``:
    the ``pynvml`` module (tests pass a fake).
    """

    def __init__(
        self,
        kind: str = "",
        *,
        index: int = 0,
        control: NvmlControl | None = None,
        sampled: SampledOptions | None = None,
        nvml: ModuleType | None = None,
    ) -> None:
        control, sampled = control or NvmlControl(), sampled or SampledOptions()
        knob = check_knob_setting(control.knob)
        if knob != GPU_FREQ_MHZ.setting:
            power_limit_grid_w(1.0, 1.0, control.power_limit_step_w)  # checked before NVML
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
            self.name = nvml_text(nv.nvmlDeviceGetName(self._handle))
            self.uuid = nvml_text(nv.nvmlDeviceGetUUID(self._handle))
            total_bytes = int(nv.nvmlDeviceGetMemoryInfo(self._handle).total)
            self._supported_mhz = self._supported_clocks_mhz()
            self._has_energy_counter = self._probe_energy_counter()
            self._probed = False
            self.power_reading = self._probe_power_reading()
            self._probed = True
            self._init_sampling(sampled)
            self._knob_value_set: float | None = None  # the knob's value set now (MHz or W)
            self._original_limit_mw: int | None = None
            self.power_limit_range_w = self._read_power_limit_range_w()
            self._record = safety.GpuStateRecord(sampled.state_dir, BACKEND, self.uuid)
            self.measure_only, self._knob = self._decide_mode(control.lock_clocks, knob)
            self._handle_leftover()
            if self._knob is GPU_POWER_LIMIT_W:
                assert self.power_limit_range_w is not None  # _decide_mode checked it
                freqs = power_limit_grid_w(*self.power_limit_range_w, control.power_limit_step_w)
            elif self.measure_only:
                freqs = (self._unlocked_label_mhz(),)
            else:
                freqs = self._supported_mhz
        except Exception:
            nv.nvmlShutdown()
            raise
        self._info = DeviceInfo(
            kind=kind or _slug(self.name),
            backend=BACKEND,
            knob_values=freqs,
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
                if nvml_error_code(nv, err) is None:
                    raise
        log.warning(
            "nvml: %s reports neither its clocks nor its highest clock; its LUT column is the "
            "clock read now (cells still record the clock sampled while they ran)",
            self.name,
        )
        return self.read_clock_mhz()

    def _call(self, name: str, *args: Any) -> Any:
        """``pynvml.<name>(handle, *args)``; an NVML failure is a SensorReadError naming the
        call and the GPU."""
        try:
            return getattr(self._nvml, name)(self._handle, *args)
        except Exception as err:
            if nvml_error_code(self._nvml, err) is None and not isinstance(err, OSError):
                raise
            raise SensorReadError(
                f"nvml: {name} failed on {self.name} ({self.uuid}): {err}"
            ) from None

    @property
    def clock_table_mhz(self) -> tuple[float, ...]:
        return self._supported_mhz

    @property
    def clocks_locked(self) -> bool:
        return not self.measure_only and self._knob is GPU_FREQ_MHZ

    @property
    def knob(self) -> Knob:
        """What ``knob_values`` and ``set_knob_value`` carry: the GPU frequency (MHz) or
        the GPU power limit (W)."""
        return self._knob

    def _read_power_limit_range_w(self) -> tuple[float, float] | None:
        """(lowest, highest) power limit the GPU allows, in W; None where NVML does not say."""
        nv = self._nvml
        get = getattr(nv, "nvmlDeviceGetPowerManagementLimitConstraints", None)
        if get is None:
            return None
        try:
            lo_mw, hi_mw = get(self._handle)
        except Exception as err:
            if nvml_error_code(nv, err) is None:
                raise
            log.info("nvml: power-limit range not reported (%s)", err)
            return None
        return (mw_to_w(lo_mw), mw_to_w(hi_mw)) if 0 < lo_mw <= hi_mw else None

    def power_limit_w(self) -> float:
        """The power limit in force now, in W (read only)."""
        return mw_to_w(self._call("nvmlDeviceGetPowerManagementLimit"))

    def _decide_mode(self, lock_clocks: bool | None, knob: str) -> tuple[bool, Knob]:
        """(measure-only, knob) for the ``lock_clocks`` and ``knob`` settings."""
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
        limits = self.power_limit_range_w
        if knob == GPU_POWER_LIMIT_W.setting:
            if lock_clocks is False:
                raise ValueError(
                    "knob: power-limit sets the GPU's power limit, and lock-clocks = false "
                    "means change nothing on the GPU (measure only); use one of the two"
                )
            if limits is None:
                raise DeviceUnavailableError(
                    f"knob: power-limit: {self.name} reports no power-limit range "
                    "(nvmlDeviceGetPowerManagementLimitConstraints); use knob = frequency"
                )
            if not is_root:
                raise DevicePermissionError(
                    f"nvml: setting the power limit of {self.name} needs root; run the "
                    "SuperNode as root, or set knob = frequency and lock-clocks = false to "
                    "measure only"
                )
            return False, GPU_POWER_LIMIT_W
        clocks_lock = is_root and lock_clocks is not False and bool(self._supported_mhz)
        if knob == "auto" and is_root and lock_clocks is not False and not clocks_lock and limits:
            log.info(
                "nvml: %s lists no clocks to lock: knob auto selects over its power limits "
                "(%g–%g W)",
                self.name,
                *limits,
            )
            return False, GPU_POWER_LIMIT_W
        return self._decide_measure_only(lock_clocks), GPU_FREQ_MHZ

    def _nvml_index(self, cuda_index: int) -> int:
        nv = self._nvml
        count = int(nv.nvmlDeviceGetCount())
        visible = os.environ.get(CUDA_VISIBLE_ENV)
        if visible is None:  # only the count matters
            return cuda_to_nvml_index(cuda_index, None, [""] * count)
        uuids = [
            nvml_text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(i))) for i in range(count)
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
        """Put back what a killed run left changed (its state file: a power limit, or locked
        clocks); measure-only mode never touches them."""
        try:
            state = self._record.leftover()
        except DeviceError as err:  # a live process holds the GPU's clocks
            if not self.measure_only:
                raise
            log.warning("%s; measuring only, the clocks stay as they are", err)
            return
        if state is None or state.pid == os.getpid():  # none, or held by this process
            return
        what = "power limit" if SAVED_LIMIT_KEY in state.settings else "clocks"
        if self.measure_only:
            log.warning(
                "nvml: a killed run may have left the %s of %s changed (state file %s); "
                "measure-only leaves them as they are: as root, run `powerfl devices --restore`",
                what,
                self.name,
                self._record.path,
            )
            return
        put_back(self._nvml, self._handle, state.settings, self.name)
        safety.clear_state(self._record.path)
        log.warning("nvml: put back the %s a killed run left changed on %s", what, self.name)

    def _supported_clocks_mhz(self) -> tuple[float, ...]:
        nv, h = self._nvml, self._handle
        try:
            mem_mhz = max(int(m) for m in nv.nvmlDeviceGetSupportedMemoryClocks(h))
            gpu_mhz = nv.nvmlDeviceGetSupportedGraphicsClocks(h, mem_mhz)
        except Exception as err:
            if nvml_error_code(nv, err) is None:
                raise
            log.info("nvml: supported clocks not reported (%s)", err)
            return ()
        return tuple(sorted({float(f) for f in gpu_mhz}))

    def _probe_energy_counter(self) -> bool:
        try:
            self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
        except Exception as err:
            if nvml_error_code(self._nvml, err) is None:
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
            code = nvml_error_code(nv, err)
            if code is None:
                raise
            if code != NOT_SUPPORTED and self._probed:
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

    def read_clock_mhz(self) -> float:
        return float(self._call("nvmlDeviceGetClockInfo", self._nvml.NVML_CLOCK_GRAPHICS))

    def current_knob_value(self) -> float:
        """The clock in MHz, or with the power-limit knob the power limit in force, in W."""
        return self.power_limit_w() if self._knob is GPU_POWER_LIMIT_W else self.read_clock_mhz()

    def set_knob_value(self, knob_value: float) -> None:
        """Lock the clock at ``knob_value`` MHz, or with the power-limit knob set the power
        limit to that many W (a value of ``knob_values`` either way)."""
        if self._knob is GPU_POWER_LIMIT_W:
            limit_w = self._grid_limit_w(knob_value)
            with self._lock:
                self._set_limit_w(limit_w)
            return
        match = next((f for f in self.knob_values if abs(f - knob_value) < 1e-3), None)
        if match is None:
            if self.measure_only:
                raise InvalidFrequencyError(
                    f"gpu-freq-mhz: {self.name} is measure-only (locking clocks needs root "
                    f"and lock-clocks not false); its only column is its unlocked clock, "
                    f"labelled {self.knob_values[0]:g} MHz (its highest), not {knob_value:g} MHz"
                )
            raise InvalidFrequencyError(
                f"gpu-freq-mhz: {knob_value:g} MHz is not a supported clock of {self.name}; "
                f"allowed: {', '.join(f'{f:g}' for f in self.knob_values)}"
            )
        if self.measure_only:
            return  # the unlocked clock: nothing to change
        with self._lock:
            self._lock_mhz(match)

    def _grid_limit_w(self, limit_w: float) -> float:
        """``limit_w`` as a value of the grid; InvalidFrequencyError naming the key and the
        GPU's range (outside it) or the grid's values, before anything changes."""
        key = GPU_POWER_LIMIT_W.config_key
        assert self.power_limit_range_w is not None
        lo, hi = self.power_limit_range_w
        if not (math.isfinite(limit_w) and lo - 1e-3 <= limit_w <= hi + 1e-3):
            raise InvalidFrequencyError(
                f"{key}: {limit_w:g} W is outside the power-limit range of {self.name}, "
                f"{lo:g}–{hi:g} W (nvmlDeviceGetPowerManagementLimitConstraints); nothing "
                "was changed"
            )
        match = next((w for w in self.knob_values if abs(w - limit_w) < 1e-3), None)
        if match is None:
            raise InvalidFrequencyError(
                f"{key}: {limit_w:g} W is not on the power-limit grid of {self.name} "
                f"(power-limit-step-w); allowed: {', '.join(f'{w:g}' for w in self.knob_values)}"
            )
        return match

    def _set_limit_w(self, limit_w: float) -> None:
        """Save the limit in force (first change only: state file before the change), then
        set ``limit_w``. A refused first change leaves no state file; a refused later one
        puts the original limit back."""
        nv = self._nvml
        first = not self._record.active
        if first:
            original_mw = int(self._call("nvmlDeviceGetPowerManagementLimit"))
            settings = {"uuid": self.uuid, "index": self.index, SAVED_LIMIT_KEY: original_mw}
            self._record.begin(settings, self.restore)
            self._original_limit_mw = original_mw
        try:
            nv.nvmlDeviceSetPowerManagementLimit(self._handle, round(limit_w * 1000))
        except Exception as err:
            code = nvml_error_code(nv, err)
            if code is None:
                raise
            if first:  # nothing was changed: no state to keep
                self._record.end()
                self._original_limit_mw = None
            else:
                self._restore_after_failed_lock()
            if code == NO_PERMISSION:
                raise DevicePermissionError(
                    f"nvml: no permission to set the power limit of {self.name}: "
                    "run the SuperNode as root"
                ) from None
            raise DeviceError(
                f"nvml: setting the power limit of {self.name} to {limit_w:g} W failed: {err}"
            ) from None
        self._knob_value_set = limit_w

    def _lock_mhz(self, freq_mhz: float) -> None:
        """Lock, then (first lock only) save the state: a refused lock leaves no file."""
        nv = self._nvml
        try:
            nv.nvmlDeviceSetGpuLockedClocks(self._handle, int(freq_mhz), int(freq_mhz))
        except Exception as err:
            code = nvml_error_code(nv, err)
            if code is None:
                raise
            self._restore_after_failed_lock()
            if code == NO_PERMISSION:
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
        self._knob_value_set = freq_mhz

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

    def step_down_knob_value(self) -> float | None:
        """One level of the knob lower (the next lower clock, or power limit); None when
        nothing is set or it is the lowest already."""
        with self._lock:
            lower = level_below(self.knob_values, self._knob_value_set)
            if lower is not None:
                if self._knob is GPU_POWER_LIMIT_W:
                    self._set_limit_w(lower)
                else:
                    self._lock_mhz(lower)
            return lower

    def _reset_clocks(self) -> None:
        try:
            self._nvml.nvmlDeviceResetGpuLockedClocks(self._handle)
        except Exception as err:
            code = nvml_error_code(self._nvml, err)
            if code is None:
                raise
            if code == NO_PERMISSION:
                raise DevicePermissionError(
                    f"nvml: no permission to reset the locked clocks of {self.name}: "
                    f"{PERMISSION_HINT}"
                ) from None
            raise DeviceError(
                f"nvml: resetting the locked clocks of {self.name} failed: {err}"
            ) from None

    def restore(self) -> None:
        """Put back what was changed: the original power limit, or reset the locked clocks.
        A failure is logged as an error and raised; the state file then stays, so the next
        open (or ``powerfl devices --restore``) tries again."""
        with self._lock:
            if not self._record.active:
                return
            if self._original_limit_mw is not None:
                saved = {SAVED_LIMIT_KEY: self._original_limit_mw}
                try:
                    put_back(self._nvml, self._handle, saved, self.name)
                except DeviceError as err:
                    log.error(
                        "%s; the state file %s stays: as root, run `powerfl devices --restore`",
                        err,
                        self._record.path,
                    )
                    raise
                self._original_limit_mw = None
            else:
                self._reset_clocks()
            self._record.end()
            self._knob_value_set = None

    def read_power_w(self) -> float:
        """Instantaneous power where the GPU reports it (else NVML's ~1 s average), in W."""
        if self.power_reading == "instant":
            try:
                return self._read_instant_power_mw() / 1000.0
            except _NoInstantPowerError:
                pass  # a transient refusal: this one sample is the average
            except Exception as err:
                if nvml_error_code(self._nvml, err) is None:
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
        """What ``powerfl devices`` shows (read-only calls: nothing is changed)."""
        if self._knob is GPU_POWER_LIMIT_W:
            mode, grid = "power limit", {GPU_POWER_LIMIT_W.values_key: list(self.knob_values)}
        else:
            mode = "measure-only" if self.measure_only else "locked clocks"
            grid = {"gpu-freqs-mhz": list(self.knob_values)}
        return {
            "kind": self._info.kind,
            "backend": BACKEND,
            "name": self.name,
            "uuid": self.uuid,
            "index": self.index,
            "cuda-index": self.cuda_index,
            "mode": mode,
            "knob": self._knob.setting,
            **grid,
            "supported-clocks-mhz": list(self._supported_mhz),
            "cur-freq-mhz": self.read_clock_mhz(),
            "memory-bytes": self._info.memory_bytes,
            "power-rail": POWER_RAIL,
            "power-reading": self.power_reading,
            "power-sensor": self._info.sensor.label,
            "power-w": self.read_power_w(),
            "energy-counter": self._has_energy_counter,
            **self._power_limit_report(),
            "state-file": str(self._record.path),
        }

    def _power_limit_report(self) -> dict[str, Any]:
        """The power limit now, the GPU's range and default (read only); what NVML does not
        report is left out."""
        out: dict[str, Any] = {}
        with contextlib.suppress(SensorReadError, AttributeError):
            out["power-limit-w"] = self.power_limit_w()
        if self.power_limit_range_w is not None:
            out["power-limit-range-w"] = list(self.power_limit_range_w)
        get_default = getattr(self._nvml, "nvmlDeviceGetPowerManagementDefaultLimit", None)
        if get_default is not None:
            try:
                out["power-limit-default-w"] = mw_to_w(get_default(self._handle))
            except Exception as err:
                if nvml_error_code(self._nvml, err) is None:
                    raise
        return out

    def _release(self) -> None:
        self._nvml.nvmlShutdown()


def restore_saved_settings(settings: Mapping[str, Any], nvml: ModuleType | None = None) -> None:
    """Put back what a state file saved for its GPU (``--restore``): the power limit it
    holds, else reset the locked clocks."""
    nv = nvml if nvml is not None else import_pynvml()
    nv.nvmlInit()
    try:
        try:
            handle = nv.nvmlDeviceGetHandleByUUID(str(settings["uuid"]))
        except Exception as err:
            if nvml_error_code(nv, err) is None:
                raise
            raise DeviceError(f"nvml: GPU {settings['uuid']} not found: {err}") from None
        put_back(nv, handle, settings, f"GPU {settings['uuid']}")
    finally:
        nv.nvmlShutdown()
