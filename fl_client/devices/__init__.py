"""Device backends behind one protocol, and the factory that opens one.

Importing this package never needs hardware or vendor libraries: each backend imports its
library (pynvml, jtop) only when opened, and ``open_device(..., backend="auto")`` says why
each backend it passed over was not available.
"""

from __future__ import annotations

import logging
import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace

from fl_client.devices.base import (
    GPU_FREQ_MHZ,
    GPU_POWER_LIMIT_W,
    KNOB_SETTINGS,
    B1Band,
    Device,
    DeviceError,
    DeviceInfo,
    DevicePermissionError,
    DeviceUnavailableError,
    InvalidFrequencyError,
    Knob,
    Measurement,
    Meter,
    Workload,
    check_knob_setting,
    locked,
)
from fl_client.devices.guard import DEFAULT_CAP_WINDOW_S
from fl_client.devices.names import (
    AUTO_ORDER,
    BACKENDS,
    POWER_SOURCES,
    key_hint,
    unknown_key_message,
)
from fl_client.devices.sampler import DEFAULT_SAMPLE_RATE_HZ, SampledOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceOptions:
    """Settings of the hardware and replay backends (node_config keys in kebab-case).

    The keys are declared, checked and parsed by the settings table
    (``fl_client.settings_table.DEVICE_OPTION_SETTINGS``), which builds these options
    (``settings_table.device_options``); the one rule across keys (no power-limit knob
    with ``lock-clocks = false``) is checked here.

    ``cap_window_s`` is how long sampled power may stay above P_max before the cap guard
    (armed around training by ``cap_guard``) steps the GPU frequency down one level.
    """

    sysfs_root: str = "/"  # jetson: the folder holding sys/ and proc/, or the sysfs mount
    state_dir: str | None = None  # default: $POWERFL_STATE_DIR or ~/.cache/powerfl/state
    power_source: str = "auto"  # jetson: auto | sysfs | jtop
    power_rails: tuple[str, ...] = ()  # jetson: rails summed as "board" power; () = VDD_IN…
    sample_rate_hz: float = DEFAULT_SAMPLE_RATE_HZ
    cap_window_s: float = DEFAULT_CAP_WINDOW_S
    replay_table: str | None = None
    nvml_index: int = 0  # nvml: the GPU as CUDA numbers it here (cuda:N), via CUDA_VISIBLE_DEVICES
    lock_clocks: bool | None = None  # nvml: None = when root, False = measure-only
    #: What the grid's second axis sets (``KNOB_SETTINGS``): the GPU frequency, the GPU
    #: power limit (nvml only), or auto (frequency where clocks can be locked, else the
    #: power limit); a replay table's knob is its own, and must agree when named.
    knob: str = GPU_FREQ_MHZ.setting
    #: nvml with the power-limit knob: the grid's step, from the GPU's highest limit down.
    power_limit_step_w: float = 25.0
    #: Simulated drift of the twin (off by default), e.g. thermal throttling or a busy
    #: neighbour process: from round ``twin_drift_from_round`` on, every step takes
    #: ``twin_slowdown`` times longer and draws ``twin_extra_power_w`` more.
    twin_slowdown: float = 1.0
    twin_extra_power_w: float = 0.0
    twin_drift_from_round: int = 1

    def __post_init__(self) -> None:
        if self.knob == GPU_POWER_LIMIT_W.setting and self.lock_clocks is False:
            raise ValueError(
                "knob: power-limit sets the GPU's power limit, and lock-clocks = false means "
                "change nothing on the GPU (measure only); use one of the two"
            )

    def at_round(self, server_round: int) -> DeviceOptions:
        """These options as they apply in ``server_round`` (the twin's drift off before it)."""
        if server_round >= self.twin_drift_from_round:
            return self
        return replace(self, twin_slowdown=1.0, twin_extra_power_w=0.0)

    def sampled(self) -> SampledOptions:
        """The options every sampled hardware backend (jetson, nvml) takes alike."""
        return SampledOptions(self.state_dir, self.sample_rate_hz, self.cap_window_s)


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can open here, and why not."""

    backend: str
    available: bool
    reason: str


#: Backends that set the GPU power limit (the ``power-limit`` knob).
POWER_LIMIT_BACKENDS = ("nvml",)


def check_knob_backend(backend: str, knob: str) -> None:
    """Refuse the ``power-limit`` knob on a backend that cannot set a power limit (the
    Jetson boards and their twins set the GPU frequency; a replay table has its own knob,
    checked when it is read). ValueError naming ``knob`` and the backends that can."""
    if knob == GPU_POWER_LIMIT_W.setting and backend in ("simulated", "jetson"):
        raise ValueError(
            f"knob: power-limit needs a GPU whose power limit can be set (backend "
            f"{', '.join(POWER_LIMIT_BACKENDS)}, or a replay table indexed by power_limit_w); "
            f"the {backend} backend sets the GPU frequency: use knob = frequency or auto"
        )


def _check_replay_knob(device: Device, knob: str) -> None:
    have = getattr(device, "knob", GPU_FREQ_MHZ)
    if knob != "auto" and knob != have.setting:
        raise ValueError(
            f"knob: {knob} was asked, but the replay table of {device.info.kind} is indexed "
            f"by its {have.label} ({have.key}); set knob = {have.setting} or auto"
        )


def _open_backend(kind: str, backend: str, seed: int, options: DeviceOptions) -> Device:
    check_knob_backend(backend, options.knob)
    if backend == "simulated":
        from fl_client.devices.descriptors import load_device_spec
        from fl_client.devices.simulated import SimulatedDevice

        return SimulatedDevice(
            load_device_spec(kind),
            seed=seed,
            slowdown=options.twin_slowdown,
            extra_power_w=options.twin_extra_power_w,
        )
    if backend == "jetson":
        from fl_client.devices.jetson import JetsonDevice

        return JetsonDevice(
            kind,
            root=options.sysfs_root,
            power_source=options.power_source,
            power_rails=options.power_rails or None,
            sampled=options.sampled(),
        )
    if backend == "nvml":
        from fl_client.devices.nvml import NvmlControl, NvmlDevice

        control = NvmlControl(options.lock_clocks, options.knob, options.power_limit_step_w)
        return NvmlDevice(
            kind, index=options.nvml_index, control=control, sampled=options.sampled()
        )
    if backend == "replay":
        from fl_client.devices.replay import ReplayDevice

        if not options.replay_table:
            raise DeviceUnavailableError(
                "replay-table: the replay backend needs a measured table (CSV or JSON; "
                "see configs/replay/README.md)"
            )
        device = ReplayDevice.from_file(options.replay_table, kind)
        _check_replay_knob(device, options.knob)
        return device
    raise ValueError(f"backend: unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")


def detect_backends(kind: str = "", options: DeviceOptions | None = None) -> list[BackendStatus]:
    """Which backends could open here, without changing anything or opening a device."""
    opts = options or DeviceOptions()
    out = []
    from fl_client.devices.jetson_power import find_power_rails
    from fl_client.devices.jetson_sysfs import find_gpu_devfreq

    node = find_gpu_devfreq(opts.sysfs_root)
    if node is None:
        out.append(BackendStatus("jetson", False, "no Jetson GPU devfreq node"))
    else:
        rails = [r.name for r in find_power_rails(opts.sysfs_root)]
        out.append(
            BackendStatus(
                "jetson", True, f"GPU at {node}; INA3221 rails: {', '.join(rails) or 'none'}"
            )
        )
    try:
        from fl_client.devices.nvml_lib import gpu_count

        count = gpu_count()
        out.append(
            BackendStatus("nvml", count > 0, f"{count} NVIDIA GPU(s)" if count else "no GPU")
        )
    except DeviceUnavailableError as err:
        out.append(BackendStatus("nvml", False, str(err).removeprefix("nvml: ")))
    if opts.replay_table:
        exists = os.path.isfile(os.path.expanduser(opts.replay_table))
        out.append(
            BackendStatus(
                "replay", exists, opts.replay_table if exists else "replay-table file not found"
            )
        )
    else:
        out.append(BackendStatus("replay", False, "no replay-table given"))
    out.append(_simulated_status(kind))
    return out


def _simulated_status(kind: str) -> BackendStatus:
    try:
        from fl_client.devices.descriptors import DEVICE_KINDS
    except ImportError as err:
        return BackendStatus("simulated", False, f"twin not available ({err})")
    if kind in DEVICE_KINDS:
        return BackendStatus("simulated", True, f"digital twin of {kind}")
    return BackendStatus(
        "simulated", False, f"no twin for kind {kind!r} (twins: {', '.join(DEVICE_KINDS)})"
    )


def cap_guard(
    device: Device, p_max_w: float | None, *, window_s: float | None = None
) -> AbstractContextManager[None]:
    """Arm ``device``'s cap guard around training (a no-op for backends without one).

    Inside the block, a ``jetson`` or ``nvml`` meter steps the GPU frequency down one level
    whenever sampled power stays above ``p_max_w`` for the window, and its measurement
    reports ``cap_violations`` and ``time_over_cap_s``. Not for profiling, which must
    measure the configurations above the cap.
    """
    guard = getattr(device, "cap_guard", None)
    if guard is None:
        return nullcontext()
    return guard(p_max_w, window_s=window_s)


def open_device(
    kind: str,
    backend: str = "simulated",
    *,
    seed: int = 0,
    options: DeviceOptions | None = None,
) -> Device:
    """Open the device ``kind`` through ``backend``.

    ``kind`` names a descriptor in ``configs/devices`` (e.g. ``jetson-nano``); the
    hardware backends use it as the reported kind (empty: detected). ``backend="auto"`` tries
    jetson, nvml, replay (when ``options.replay_table`` is set) and the digital twin, in this order,
    and logs why each one passed over was not available. ``seed`` only affects the twin.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    opts = options or DeviceOptions()
    if backend != "auto":
        return _open_backend(kind, backend, seed, opts)
    reasons = []
    for candidate in AUTO_ORDER:
        if candidate == "replay" and not opts.replay_table:
            reasons.append("replay: no replay-table given")
            continue
        try:
            check_knob_backend(candidate, opts.knob)
        except ValueError:
            reasons.append(f"{candidate}: sets no power limit (knob = power-limit)")
            continue
        try:
            device = _open_backend(kind, candidate, seed, opts)
        except DeviceUnavailableError as err:
            reasons.append(f"{candidate}: {err}")
            continue
        except (ImportError, LookupError, OSError, ValueError) as err:
            if candidate != "simulated":  # e.g. a broken replay table: the user must know
                raise
            reasons.append(f"{candidate}: {err}")
            continue
        for reason in reasons:
            log.info("backend auto: passed over %s", reason)
        log.info("backend auto: using %s for %s", candidate, device.info.kind)
        return device
    raise DeviceUnavailableError("backend auto: no backend available; " + "; ".join(reasons))


__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "GPU_FREQ_MHZ",
    "GPU_POWER_LIMIT_W",
    "KNOB_SETTINGS",
    "POWER_LIMIT_BACKENDS",
    "POWER_SOURCES",
    "B1Band",
    "BackendStatus",
    "Device",
    "DeviceError",
    "DeviceInfo",
    "DeviceOptions",
    "DevicePermissionError",
    "DeviceUnavailableError",
    "InvalidFrequencyError",
    "Knob",
    "Measurement",
    "Meter",
    "Workload",
    "cap_guard",
    "check_knob_backend",
    "check_knob_setting",
    "detect_backends",
    "key_hint",
    "locked",
    "open_device",
    "unknown_key_message",
]
