"""The ``jetson`` backend: GPU frequency through devfreq sysfs, power from the INA3221 monitor.

Every path is taken relative to a root (default ``/``), so tests run on fake trees; the root
may be the folder holding ``sys/`` and ``proc/`` or the sysfs mount itself (``…/sys``).

* GPU: the devfreq node whose ``device/of_node/name`` is a Jetson GPU (``gpu``, ``gp10b``,
  ``gv11b``, ``ga10b``), or one of the known per-generation nodes. Frequencies are in Hz in
  sysfs and MHz here. Locking writes ``min_freq`` and ``max_freq`` in the order that keeps
  min ≤ max at every step, reads both back, and ``restore()`` writes back what was found.
* Power: INA3221 chips under ``/sys/bus/i2c/devices`` (JetPack ≤ 4 iio, JetPack ≥ 5 hwmon);
  the cap applies to the board's input rail (``VDD_IN`` / ``POM_5V_IN``), or to the sum of
  all connected rails on boards without one (AGX Xavier, AGX Orin). ``jtop`` (jetson-stats)
  is the fallback power reader; it cannot set the GPU frequency.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fl_client.devices import safety
from fl_client.devices.base import (
    DeviceError,
    DeviceInfo,
    DevicePermissionError,
    DeviceUnavailableError,
    InvalidFrequencyError,
    level_below,
)
from fl_client.devices.names import POWER_SOURCES
from fl_client.devices.sampler import DEFAULT_CAP_WINDOW_S, DEFAULT_SAMPLE_RATE_HZ, SampledDevice
from fl_client.devices.sensors import SensorSpec, ina3221_sensor, jtop_sensor
from fl_client.devices.simulated import descriptor_b1_bands, descriptor_board_sensor

log = logging.getLogger(__name__)

BACKEND = "jetson"
# devfreq node → board generation (DESIGN §4); used when of_node/name is missing.
KNOWN_GPU_NODES = {
    "57000000.gpu": "Nano / TX1 (JetPack 4)",
    "17000000.gp10b": "TX2",
    "17000000.gv11b": "Xavier",
    "17000000.ga10b": "Orin (JetPack 5)",
    "17000000.gpu": "Orin (JetPack 6)",
}
GPU_OF_NODE_NAMES = ("gpu", "gm20b", "gp10b", "gv11b", "ga10b")
# Rails that carry the whole board's input power, in order of preference.
BOARD_RAILS = ("VDD_IN", "POM_5V_IN")
SKIPPED_RAIL_LABELS = ("nc", "sum of shunt voltages")
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
# jtop's service refreshes at its own interval; asking it for more than 10 Hz costs CPU only.
JTOP_MIN_INTERVAL_S = 0.1

Writer = Callable[[Path, str], None]


def write_sysfs(path: Path, value: str) -> None:
    """Write one sysfs attribute (the only place this backend writes to the hardware)."""
    with open(path, "w") as fh:
        fh.write(value)


class SysfsFormatError(DeviceError, ValueError):
    """A sysfs file whose content is not what the kernel writes there; names the file."""


def _read_text(path: Path) -> str:
    return path.read_text().replace("\x00", "").strip()


def _parse_int(path: Path, token: str, text: str) -> int:
    try:
        return int(token)
    except ValueError:
        raise SysfsFormatError(f"{path}: expected an integer, got {text[:60]!r}") from None


def _read_int(path: Path) -> int:
    # Some attributes carry a unit after the number ("32760 ma").
    text = _read_text(path)
    return _parse_int(path, text.split()[0] if text else "", text)


@dataclass(frozen=True)
class SysfsRoot:
    """Where sysfs (``sys``) and procfs (``proc``) are for a root given by the user."""

    given: Path
    sys: Path
    proc: Path


def _is_sysfs(path: Path) -> bool:
    return (path / "class").is_dir() and (path / "devices").is_dir()


def sysfs_root(root: str | os.PathLike[str] = "/") -> SysfsRoot:
    """Resolve ``root``: the folder holding ``sys/`` (e.g. ``/``) or the sysfs mount itself.

    Given the mount (``/sys``, ``/mnt/board/sys``), procfs is taken from its sibling
    ``proc`` (``/proc``, ``/mnt/board/proc``).
    """
    given = Path(root).expanduser()
    if not _is_sysfs(given / "sys") and _is_sysfs(given):
        return SysfsRoot(given, given, given.parent / "proc")
    return SysfsRoot(given, given / "sys", given / "proc")


def permission_message(path: Path, node: Path | None = None) -> str:
    """What permission is missing for ``path`` and the two ways to grant it."""
    kernel = node.name if node is not None else "<gpu devfreq node>"
    return (
        f"no write permission on {path}: setting the Jetson GPU frequency writes devfreq "
        "min_freq/max_freq, which only root may do. Either run the SuperNode as root "
        "(sudo flower-supernode ...), or grant write access with a udev rule, e.g. in "
        "/etc/udev/rules.d/99-powerfl-gpufreq.rules:\n"
        f'  SUBSYSTEM=="devfreq", KERNEL=="{kernel}", RUN+="/bin/chgrp powerfl '
        '/sys%p/min_freq /sys%p/max_freq", RUN+="/bin/chmod g+w /sys%p/min_freq '
        '/sys%p/max_freq"\n'
        "then `sudo groupadd -f powerfl && sudo usermod -aG powerfl $USER`, "
        "`sudo udevadm control --reload && sudo udevadm trigger -s devfreq` and log in again. "
        "(jtop/jetson-stats can read power but cannot set the GPU frequency.)"
    )


# ------------------------------------------------------------------------------ devfreq GPU


def _of_node_name(entry: Path) -> str | None:
    for rel in ("device/of_node/name", "of_node/name"):
        try:
            return _read_text(entry / rel)
        except OSError:
            continue
    return None


def find_gpu_devfreq(root: str | os.PathLike[str] = "/") -> Path | None:
    """The GPU's devfreq folder under ``root``, or None on a machine without one."""
    base = sysfs_root(root).sys / "class" / "devfreq"
    entries = sorted(base.iterdir()) if base.is_dir() else []
    for entry in entries:
        if _of_node_name(entry) in GPU_OF_NODE_NAMES and (entry / "available_frequencies").exists():
            return entry
    for entry in entries:
        if entry.name in KNOWN_GPU_NODES and (entry / "available_frequencies").exists():
            return entry
    return None


@dataclass(frozen=True)
class DevfreqSettings:
    """The devfreq limits this backend changes, and the governor (reported, left as is)."""

    min_freq_hz: int
    max_freq_hz: int
    governor: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "min-freq-hz": self.min_freq_hz,
            "max-freq-hz": self.max_freq_hz,
            "governor": self.governor,
        }


class DevfreqGpu:
    """Reads and writes one devfreq node (values in Hz)."""

    def __init__(self, node: Path, *, writer: Writer = write_sysfs) -> None:
        self.node = node
        self._writer = writer

    @property
    def of_node_name(self) -> str | None:
        return _of_node_name(self.node)

    def available_freqs_hz(self) -> tuple[int, ...]:
        path = self.node / "available_frequencies"
        text = _read_text(path)
        freqs = sorted({_parse_int(path, tok, text) for tok in text.split()})
        if not freqs:
            raise DeviceError(f"{path} lists no frequencies")
        return tuple(freqs)

    def cur_freq_hz(self) -> int:
        return _read_int(self.node / "cur_freq")

    def read_settings(self) -> DevfreqSettings:
        governor_path = self.node / "governor"
        governor = _read_text(governor_path) if governor_path.exists() else None
        return DevfreqSettings(
            _read_int(self.node / "min_freq"), _read_int(self.node / "max_freq"), governor
        )

    def check_writable(self) -> None:
        """Fail before any change when the limits cannot be written."""
        for name in ("min_freq", "max_freq"):
            path = self.node / name
            if not os.access(path, os.W_OK):
                raise DevicePermissionError(permission_message(path, self.node))

    def _write(self, name: str, value_hz: int) -> None:
        path = self.node / name
        try:
            self._writer(path, str(int(value_hz)))
        except PermissionError:
            raise DevicePermissionError(permission_message(path, self.node)) from None
        except OSError as err:
            if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise DevicePermissionError(permission_message(path, self.node)) from None
            raise DeviceError(
                f"writing {value_hz} Hz to {path} failed: {err.strerror or err}"
            ) from None

    def apply(self, min_hz: int, max_hz: int) -> DevfreqSettings:
        """Set both limits, never letting min exceed max on the way; return the read-back."""
        if min_hz > max_hz:
            raise ValueError(f"min {min_hz} Hz above max {max_hz} Hz")
        current = self.read_settings()
        if (current.min_freq_hz, current.max_freq_hz) == (min_hz, max_hz):
            return current
        if min_hz > current.max_freq_hz:  # raising: lift max first
            self._write("max_freq", max_hz)
            self._write("min_freq", min_hz)
        else:  # lowering or inside: lower min first
            self._write("min_freq", min_hz)
            self._write("max_freq", max_hz)
        return self.read_settings()

    def lock(self, freq_hz: int) -> None:
        """Pin min = max = ``freq_hz`` and check by read-back that the GPU cannot run faster.

        A read-back max below the request (thermal limit, power mode) only slows the GPU
        and keeps it under the cap: a warning. One above it means the lock did not hold.
        """
        after = self.apply(freq_hz, freq_hz)
        if after.max_freq_hz > freq_hz:
            raise DeviceError(
                f"{self.node}: wrote min/max {freq_hz} Hz but max_freq reads "
                f"{after.max_freq_hz} Hz: the lock did not hold"
            )
        if (after.min_freq_hz, after.max_freq_hz) != (freq_hz, freq_hz):
            log.warning(
                "jetson: asked for %g MHz, the kernel keeps min/max at %g/%g MHz (a thermal "
                "limit or the power mode caps the GPU; `sudo nvpmodel -q`)",
                _mhz(freq_hz),
                _mhz(after.min_freq_hz),
                _mhz(after.max_freq_hz),
            )

    def restore_to(self, settings: DevfreqSettings) -> None:
        """Write back the limits found at start (warn if the kernel shows others)."""
        want = (settings.min_freq_hz, settings.max_freq_hz)
        after = self.apply(*want)
        if (after.min_freq_hz, after.max_freq_hz) != want:
            log.warning(
                "jetson: restored min/max %d/%d Hz, the kernel shows %d/%d Hz",
                *want,
                after.min_freq_hz,
                after.max_freq_hz,
            )


def restore_saved_settings(settings: Mapping[str, Any]) -> None:
    """Put back devfreq limits from a state file (used by ``safety.restore_leftovers``)."""
    node = Path(str(settings["node"]))
    if not node.is_dir():
        raise DeviceError(f"devfreq node {node} from the state file does not exist")
    DevfreqGpu(node).restore_to(
        DevfreqSettings(int(settings["min-freq-hz"]), int(settings["max-freq-hz"]))
    )


# ------------------------------------------------------------------------------ INA3221 power


@dataclass(frozen=True)
class PowerRail:
    """One INA3221 channel: power file (iio, mW) or voltage (mV) × current (mA)."""

    name: str
    power_path: Path | None = None
    voltage_path: Path | None = None
    current_path: Path | None = None

    def read_power_w(self) -> float:
        if self.power_path is not None:
            return _read_int(self.power_path) / 1000.0
        assert self.voltage_path is not None and self.current_path is not None
        return _read_int(self.voltage_path) * _read_int(self.current_path) / 1e6


def _skip_label(label: str) -> bool:
    return not label or label.strip().lower() in SKIPPED_RAIL_LABELS


def _why(err: OSError) -> str:
    return err.strerror or str(err)


@dataclass
class Ina3221Scan:
    """What discovery found: readable rails, the INA3221 chips, and what was missing."""

    base: Path  # .../sys/bus/i2c/devices
    rails: list[PowerRail] = field(default_factory=list)
    chips: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(self, rail: PowerRail) -> None:
        """Keep ``rail`` if it can be read now, else record why not."""
        try:
            rail.read_power_w()
        except OSError as err:
            self.problems.append(f"{rail.name}: {err.filename or rail.name}: {_why(err)}")
        except ValueError as err:
            self.problems.append(f"{rail.name}: {err}")
        else:
            self.rails.append(rail)

    def why_none(self) -> str:
        """Why there is no readable rail, naming what is missing."""
        if not self.chips:
            return f"no INA3221 under {self.base} (no i2c device whose name has 'ina3221')"
        found = ", ".join(self.chips)
        return f"INA3221 chip(s) {found} under {self.base}, but no readable channel: " + "; ".join(
            self.problems or ["no channels"]
        )


def _label(scan: Ina3221Scan, path: Path) -> str | None:
    try:
        return _read_text(path)
    except OSError as err:
        scan.problems.append(f"{path}: {_why(err)}")
        return None


def _labelled_channels(
    folder: Path, scan: Ina3221Scan, prefix: str, suffix: str = ""
) -> Iterator[tuple[str, str]]:
    """(label, N) of each connected channel whose label file is ``<prefix>N<suffix>``."""
    labels = sorted(folder.glob(f"{prefix}*{suffix}"))
    if not labels:
        scan.problems.append(f"{folder}: no {prefix}N{suffix} files")
    for label_path in labels:
        label = _label(scan, label_path)
        if label is not None and not _skip_label(label):
            yield label, label_path.name.removeprefix(prefix).removesuffix(suffix)


def _iio_rails(folder: Path, scan: Ina3221Scan) -> None:
    for label, n in _labelled_channels(folder, scan, "rail_name_"):
        power = folder / f"in_power{n}_input"
        volt, curr = folder / f"in_voltage{n}_input", folder / f"in_current{n}_input"
        if power.exists():
            scan.add(PowerRail(label, power_path=power))
        elif volt.exists() and curr.exists():
            scan.add(PowerRail(label, voltage_path=volt, current_path=curr))
        else:
            scan.problems.append(
                f"{label}: neither {power.name} nor {volt.name} + {curr.name} in {folder}"
            )


def _hwmon_rails(folder: Path, scan: Ina3221Scan) -> None:
    for label, n in _labelled_channels(folder, scan, "in", "_label"):
        volt, curr = folder / f"in{n}_input", folder / f"curr{n}_input"
        missing = [p.name for p in (volt, curr) if not p.exists()]
        if missing:
            scan.problems.append(f"{label}: {' and '.join(missing)} missing in {folder}")
            continue
        scan.add(PowerRail(label, voltage_path=volt, current_path=curr))


def _scan_chip(chip: Path, scan: Ina3221Scan) -> None:
    folders = sorted(chip.glob("iio:device*")), sorted(chip.glob("hwmon/hwmon*"))
    if not folders[0] and not folders[1]:
        scan.problems.append(f"{chip}: no iio:deviceN or hwmon/hwmonN folder (driver not bound?)")
    for folder in folders[0]:
        _iio_rails(folder, scan)
    for folder in folders[1]:
        _hwmon_rails(folder, scan)


def scan_ina3221(root: str | os.PathLike[str] = "/") -> Ina3221Scan:
    """Every readable INA3221 channel under ``root``, and what kept the others out.

    JetPack ≤ 4 iio and ≥ 5 hwmon; two chips may reuse a label: both are kept, told apart
    as ``NAME#2``.
    """
    scan = Ina3221Scan(sysfs_root(root).sys / "bus" / "i2c" / "devices")
    if not scan.base.is_dir():
        return scan
    for chip in sorted(scan.base.iterdir()):
        try:
            if "ina3221" not in _read_text(chip / "name"):
                continue
        except OSError:
            continue
        scan.chips.append(chip.name)
        _scan_chip(chip, scan)
    seen: dict[str, int] = {}
    unique = []
    for rail in scan.rails:
        seen[rail.name] = seen.get(rail.name, 0) + 1
        name = rail.name if seen[rail.name] == 1 else f"{rail.name}#{seen[rail.name]}"
        unique.append(PowerRail(name, rail.power_path, rail.voltage_path, rail.current_path))
    scan.rails = unique
    return scan


def find_power_rails(root: str | os.PathLike[str] = "/") -> list[PowerRail]:
    """Every readable INA3221 channel under ``root`` (JetPack ≤ 4 iio and ≥ 5 hwmon)."""
    return scan_ina3221(root).rails


def _rail_label(rails: Sequence[str], prefix: str = "") -> str:
    return prefix + (rails[0] if len(rails) == 1 else "sum(" + "+".join(rails) + ")")


class PowerReader(Protocol):
    rail_label: str

    def read_power_w(self) -> float: ...

    def read_rails_w(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class Ina3221Monitor:
    """Board power from INA3221 rails; ``rail_label`` says which rail(s) it sums."""

    def __init__(
        self,
        rails: Sequence[PowerRail],
        board_rails: Sequence[str],
        problems: Sequence[str] = (),
    ) -> None:
        self.rails = {r.name: r for r in rails}
        missing = [n for n in board_rails if n not in self.rails]
        if missing or not board_rails:
            unreadable = f"; unreadable: {'; '.join(problems)}" if problems else ""
            raise DeviceError(
                f"power-rails: {', '.join(missing) or '(none)'} not found; "
                f"available rails: {', '.join(self.rails) or '(none)'}{unreadable}"
            )
        self.board_rails = tuple(board_rails)
        self.rail_label = _rail_label(self.board_rails)
        self.problems = tuple(problems)

    @classmethod
    def from_scan(cls, scan: Ina3221Scan, rails: Sequence[str] | None = None) -> Ina3221Monitor:
        """The monitor of ``rails`` (default: the board input rail, else every rail)."""
        names = [r.name for r in scan.rails]
        board = list(rails) if rails else next(([n] for n in BOARD_RAILS if n in names), names)
        return cls(scan.rails, board, scan.problems)

    @classmethod
    def discover(
        cls, root: str | os.PathLike[str] = "/", rails: Sequence[str] | None = None
    ) -> Ina3221Monitor | None:
        scan = scan_ina3221(root)
        return cls.from_scan(scan, rails) if scan.rails else None

    def read_power_w(self) -> float:
        return sum(self.rails[n].read_power_w() for n in self.board_rails)

    def read_rails_w(self) -> dict[str, float]:
        return {name: rail.read_power_w() for name, rail in self.rails.items()}

    def close(self) -> None:
        pass


class JtopPowerReader:
    """Board power from the jtop service (jetson-stats); reads only, never sets clocks.

    With ``rails``, the sum of those jtop rails; else jtop's total.
    """

    def __init__(self, interval_s: float = 0.5, rails: Sequence[str] | None = None) -> None:
        try:
            from jtop import jtop
        except ImportError:
            raise DeviceUnavailableError(
                "jtop: jetson-stats is not installed (pip install jetson-stats)"
            ) from None
        self._jtop = jtop(interval=interval_s)
        try:
            self._jtop.start()
        except Exception as err:  # jtop raises its own JtopException when the service is down
            raise DeviceUnavailableError(
                f"jtop: cannot connect to the jtop service ({err}); "
                "start it with `sudo systemctl restart jtop.service`"
            ) from None
        self._rails = tuple(rails or ())
        available = list(self._jtop.power.get("rail", {}))
        missing = [r for r in self._rails if r not in available]
        if missing:
            self._jtop.close()
            raise DeviceError(
                f"power-rails: {', '.join(missing)} not found in jtop; available rails: "
                f"{', '.join(available) or '(none)'}"
            )
        total = self._jtop.power.get("tot", {})
        self.rail_label = _rail_label(self._rails or [total.get("name", "total")], "jtop:")
        # the service runs at the interval of its first client, which may not be ours
        interval = getattr(self._jtop, "interval", None)
        self.update_period_s = (
            float(interval) if isinstance(interval, int | float) and interval > 0 else interval_s
        )

    def read_power_w(self) -> float:
        if self._rails:
            rails = self._jtop.power["rail"]
            return sum(float(rails[n]["power"]) for n in self._rails) / 1000.0
        return float(self._jtop.power["tot"]["power"]) / 1000.0

    def read_rails_w(self) -> dict[str, float]:
        rails = self._jtop.power.get("rail", {})
        return {name: float(v["power"]) / 1000.0 for name, v in rails.items()}

    def close(self) -> None:
        self._jtop.close()


def open_power_reader(
    root: str | os.PathLike[str] = "/",
    source: str = "auto",
    *,
    rails: Sequence[str] | None = None,
    interval_s: float = 0.5,
) -> PowerReader:
    """The INA3221 monitor (``sysfs``), else the jtop service (``jtop``).

    A chosen rail that does not exist is an error (never silently another rail).
    """
    if source not in POWER_SOURCES:
        raise ValueError(f"power-source: unknown {source!r}; allowed: {', '.join(POWER_SOURCES)}")
    reasons = []
    if source in ("auto", "sysfs"):
        scan = scan_ina3221(root)
        if scan.rails:
            monitor = Ina3221Monitor.from_scan(scan, rails)
            try:
                monitor.read_power_w()
                return monitor
            except (OSError, ValueError) as err:
                reasons.append(f"INA3221 rails unreadable ({err})")
        else:
            reasons.append(scan.why_none())
    if source in ("auto", "jtop"):
        try:
            return JtopPowerReader(interval_s, rails)
        except DeviceUnavailableError as err:
            reasons.append(str(err))
    raise DeviceUnavailableError("jetson: no power monitor: " + "; ".join(reasons))


# ------------------------------------------------------------------------------ device


def detect_kind(root: str | os.PathLike[str] = "/") -> str | None:
    """Twin kind from ``/proc/device-tree/model`` (e.g. ``jetson-orin-nano``), or None."""
    try:
        model = _read_text(sysfs_root(root).proc / "device-tree" / "model").lower()
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


def _mhz(freq_hz: int) -> float:
    return freq_hz / 1_000_000


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
    """A Jetson GPU: devfreq frequency lock, INA3221 (or jtop) power, wall clock."""

    def __init__(
        self,
        kind: str = "",
        *,
        root: str | os.PathLike[str] = "/",
        state_dir: str | os.PathLike[str] | None = None,
        power_source: str = "auto",
        power_rails: Sequence[str] | None = None,
        sample_rate_hz: float = DEFAULT_SAMPLE_RATE_HZ,
        cap_window_s: float = DEFAULT_CAP_WINDOW_S,
        writer: Writer = write_sysfs,
    ) -> None:
        self.root = Path(root)
        self.paths = sysfs_root(root)
        node = find_gpu_devfreq(self.root)
        if node is None:
            raise DeviceUnavailableError(_no_gpu_message(self.paths))
        self._gpu = DevfreqGpu(node, writer=writer)
        self._record = safety.GpuStateRecord(state_dir, BACKEND, os.path.realpath(node))
        self._init_sampling(sample_rate_hz, cap_window_s)
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
            gpu_freqs_mhz=tuple(_mhz(f) for f in self._freqs_hz),
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

    def current_gpu_freq_mhz(self) -> float:
        return _mhz(self._gpu.cur_freq_hz())

    def locked_gpu_freq_mhz(self) -> float | None:
        return None if self._locked_hz is None else _mhz(self._locked_hz)

    def _freq_hz(self, freq_mhz: float) -> int:
        for freq_hz in self._freqs_hz:
            if abs(freq_hz - freq_mhz * 1e6) < 1000:  # within 1 kHz of a table entry
                return freq_hz
        raise InvalidFrequencyError(
            f"gpu-freq-mhz: {freq_mhz:g} MHz is not in the {self._info.kind} table; allowed: "
            + ", ".join(f"{f:g}" for f in self.gpu_freqs_mhz)
        )

    def set_gpu_freq_mhz(self, freq_mhz: float) -> None:
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
        log.info("jetson: GPU locked at %g MHz", _mhz(freq_hz))

    def step_down_gpu_freq_mhz(self) -> float | None:
        """Lock one table level lower (the cap guard's move); None if not locked or lowest."""
        with self._lock:
            lower = level_below(self._freqs_hz, self._locked_hz)
            if lower is None:
                return None
            self._lock_hz(lower)
            return _mhz(lower)

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
            "gpu-freqs-mhz": list(self.gpu_freqs_mhz),
            "cur-freq-mhz": self.current_gpu_freq_mhz(),
            "min-freq-mhz": _mhz(now.min_freq_hz),
            "max-freq-mhz": _mhz(now.max_freq_hz),
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
