"""The ``jetson`` backend: GPU frequency through devfreq sysfs, power from the INA3221 monitor.

The device (``JetsonDevice``) locks the GPU's devfreq limits (``fl_client.devices.jetson_sysfs``)
and reads the board's power from its INA3221 rails or the jtop service
(``fl_client.devices.jetson_power``), all under a root (default ``/``) so tests run on fake
trees. ``restore()`` writes back the limits found at open; a state file puts them back after
a crash (``restore_saved_settings``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fl_client.devices import safety
from fl_client.devices.base import (
    DeviceError,
    DeviceInfo,
    DeviceUnavailableError,
    InvalidFrequencyError,
    level_below,
)
from fl_client.devices.descriptors import descriptor_b1_bands, descriptor_board_sensor
from fl_client.devices.jetson_power import JTOP_MIN_INTERVAL_S, JtopPowerReader, open_power_reader
from fl_client.devices.jetson_sysfs import (
    GPU_OF_NODE_NAMES,
    KNOWN_GPU_NODES,
    DevfreqGpu,
    DevfreqSettings,
    SysfsRoot,
    Writer,
    find_gpu_devfreq,
    hz_to_mhz,
    read_text,
    sysfs_root,
    write_sysfs,
)
from fl_client.devices.sampler import SampledDevice, SampledOptions
from fl_client.devices.sensors import SensorSpec, ina3221_sensor, jtop_sensor

log = logging.getLogger(__name__)

BACKEND = "jetson"
# Substrings of /proc/device-tree/model → twin kind (first match wins).
MODEL_KINDS = (
    ("orin nano", "jetson-orin-nano"),
    ("orin nx", "jetson-orin-nx"),
    ("agx orin", "jetson-agx-orin"),
    ("xavier nx", "jetson-xavier-nx"),
    ("agx xavier", "jetson-agx-xavier"),
    ("jetson-agx", "jetson-agx-xavier"),
    ("tx2 nx", "jetson-tx2-nx"),
    ("lanai", "jetson-tx2-nx"),
    ("tx2", "jetson-tx2"),
    ("quill", "jetson-tx2"),
    ("nano", "jetson-nano"),
)


def restore_saved_settings(settings: Mapping[str, Any]) -> None:
    """Put back devfreq limits from a state file (used by ``safety.restore_leftovers``)."""
    node = Path(str(settings["node"]))
    if not node.is_dir():
        raise DeviceError(f"devfreq node {node} from the state file does not exist")
    DevfreqGpu(node).restore_to(
        DevfreqSettings(int(settings["min-freq-hz"]), int(settings["max-freq-hz"]))
    )


def detect_kind(root: str | os.PathLike[str] = "/") -> str | None:
    """Twin kind from ``/proc/device-tree/model`` (e.g. ``jetson-orin-nano``), or None."""
    try:
        model = read_text(sysfs_root(root).proc / "device-tree" / "model").lower()
    except OSError:
        return None
    return next((kind for key, kind in MODEL_KINDS if key in model), None)


def memory_bytes(root: str | os.PathLike[str] = "/") -> int:
    """MemTotal of ``/proc/meminfo`` (CPU and GPU share it on a Jetson)."""
    try:
        for line in (sysfs_root(root).proc / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _no_gpu_message(paths: SysfsRoot) -> str:
    devfreq = paths.sys / "class" / "devfreq"
    if not devfreq.is_dir():
        return (
            f"jetson: no GPU devfreq node: {devfreq} does not exist (sysfs-root "
            f"{paths.given}: give the folder holding sys/, e.g. /, or the sysfs mount itself, "
            "e.g. /sys); not a Jetson?"
        )
    return (
        f"jetson: no GPU devfreq node under {devfreq} (looked for of_node names "
        f"{', '.join(GPU_OF_NODE_NAMES)} and nodes {', '.join(KNOWN_GPU_NODES)}); not a Jetson?"
    )


class JetsonDevice(SampledDevice):
    """A Jetson GPU: devfreq frequency lock, INA3221 (or jtop) power, wall clock.

    ``root``: the folder holding ``sys/`` and ``proc/``, or the sysfs mount;
    ``power_source`` and ``power_rails``: where board power is read and which rails are
    summed (``open_power_reader``); ``sampled``: the sampling rate, the cap guard's window
    and the state folder; ``writer``: writes one sysfs attribute (tests pass a fake).
    """

    def __init__(
        self,
        kind: str = "",
        *,
        root: str | os.PathLike[str] = "/",
        power_source: str = "auto",
        power_rails: Sequence[str] | None = None,
        sampled: SampledOptions | None = None,
        writer: Writer = write_sysfs,
    ) -> None:
        sampled = sampled or SampledOptions()
        self.root = Path(root)
        self.paths = sysfs_root(root)
        node = find_gpu_devfreq(self.root)
        if node is None:
            raise DeviceUnavailableError(_no_gpu_message(self.paths))
        self._gpu = DevfreqGpu(node, writer=writer)
        self._record = safety.GpuStateRecord(sampled.state_dir, BACKEND, os.path.realpath(node))
        self._init_sampling(sampled)
        self._locked_hz: int | None = None
        self._original = self._take_over_leftover() or self._gpu.read_settings()
        self._freqs_hz = self._gpu.available_freqs_hz()
        self._power = open_power_reader(
            self.root,
            power_source,
            rails=power_rails,
            interval_s=max(JTOP_MIN_INTERVAL_S, 1.0 / self.sample_rate_hz),
        )
        detected = detect_kind(self.root)
        if kind and detected and kind != detected:
            log.warning("jetson: configured as %s but the board says %s", kind, detected)
        kind = kind or detected or "jetson"
        self._info = DeviceInfo(
            kind=kind,
            backend=BACKEND,
            knob_values=tuple(hz_to_mhz(f) for f in self._freqs_hz),
            memory_bytes=memory_bytes(self.root),
            power_rail=self._power.rail_label,
            b1_bands=descriptor_b1_bands(kind),
            sensor=self._sensor(kind),
        )

    def _sensor(self, kind: str) -> SensorSpec:
        """What the power reader needs per profiled cell: jtop's interval, or the board's
        INA3221 (its descriptor's ``[sensor]`` numbers where it has one) at our rate."""
        if isinstance(self._power, JtopPowerReader):
            return jtop_sensor(self._power.update_period_s, self.sample_rate_hz)
        board = descriptor_board_sensor(kind, self.sample_rate_hz)
        return board if board is not None else ina3221_sensor(self.sample_rate_hz)

    def _take_over_leftover(self) -> DevfreqSettings | None:
        """Settings a killed run left behind are put back; None when there is nothing to do."""
        state = self._record.leftover()
        if state is None:
            return None
        if state.pid == os.getpid():  # another instance in this process holds it
            s = state.settings
            return DevfreqSettings(int(s["min-freq-hz"]), int(s["max-freq-hz"]), s.get("governor"))
        safety.restore_saved(state)
        return None

    @property
    def devfreq_node(self) -> Path:
        return self._gpu.node

    @property
    def original_settings(self) -> DevfreqSettings:
        return self._original

    def read_clock_mhz(self) -> float:
        return hz_to_mhz(self._gpu.cur_freq_hz())

    def locked_gpu_freq_mhz(self) -> float | None:
        return None if self._locked_hz is None else hz_to_mhz(self._locked_hz)

    def _freq_hz(self, freq_mhz: float) -> int:
        for freq_hz in self._freqs_hz:
            if abs(freq_hz - freq_mhz * 1e6) < 1000:  # within 1 kHz of a table entry
                return freq_hz
        raise InvalidFrequencyError(
            f"gpu-freq-mhz: {freq_mhz:g} MHz is not in the {self._info.kind} table; allowed: "
            + ", ".join(f"{f:g}" for f in self.knob_values)
        )

    def set_knob_value(self, freq_mhz: float) -> None:
        freq_hz = self._freq_hz(freq_mhz)
        with self._lock:
            self._lock_hz(freq_hz)

    def _lock_hz(self, freq_hz: int) -> None:
        if not self._record.active:
            self._gpu.check_writable()
            settings = {"node": self._record.device_id, **self._original.to_json()}
            self._record.begin(settings, self.restore)
        try:
            self._gpu.lock(freq_hz)
        except DeviceError:
            try:
                self.restore()
            except DeviceError as err:
                log.error("jetson: restoring after a failed lock also failed: %s", err)
            raise
        self._locked_hz = freq_hz
        log.info("jetson: GPU locked at %g MHz", hz_to_mhz(freq_hz))

    def step_down_knob_value(self) -> float | None:
        """Lock one table level lower (the cap guard's move); None if not locked or lowest."""
        with self._lock:
            lower = level_below(self._freqs_hz, self._locked_hz)
            if lower is None:
                return None
            self._lock_hz(lower)
            return hz_to_mhz(lower)

    def restore(self) -> None:
        with self._lock:
            if not self._record.active:
                return
            self._gpu.restore_to(self._original)
            self._record.end()
            self._locked_hz = None
            log.info("jetson: GPU frequency limits restored")

    def read_power_w(self) -> float:
        return self._power.read_power_w()

    def describe(self) -> dict[str, Any]:
        """What ``powerfl devices`` prints: node, limits, governor, rails and their power."""
        now = self._gpu.read_settings()
        try:
            rails_w: dict[str, float] | str = self._power.read_rails_w()
        except OSError as err:
            rails_w = f"unreadable: {err}"
        return {
            "kind": self._info.kind,
            "backend": BACKEND,
            "devfreq-node": str(self._gpu.node),
            "of-node-name": self._gpu.of_node_name,
            "gpu-freqs-mhz": list(self.knob_values),
            "cur-freq-mhz": self.read_clock_mhz(),
            "min-freq-mhz": hz_to_mhz(now.min_freq_hz),
            "max-freq-mhz": hz_to_mhz(now.max_freq_hz),
            "governor": now.governor,
            "memory-bytes": self._info.memory_bytes,
            "power-rail": self._info.power_rail,
            "power-sensor": self._info.sensor.label,
            "rails-w": rails_w,
            "unreadable-rails": list(getattr(self._power, "problems", ())),
            "state-file": str(self._record.path),
        }

    def _release(self) -> None:
        self._power.close()
