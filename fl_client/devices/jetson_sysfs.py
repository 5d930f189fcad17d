"""Jetson sysfs: reading its files under a root, and the GPU's devfreq node.

Every path is taken relative to a root (default ``/``), so tests run on fake trees; the root
may be the folder holding ``sys/`` and ``proc/`` or the sysfs mount itself (``…/sys``).

The GPU is the devfreq node whose ``device/of_node/name`` is a Jetson GPU (``gpu``,
``gp10b``, ``gv11b``, ``ga10b``), or one of the known per-generation nodes. Frequencies are
in Hz in sysfs and MHz in the device. Locking writes ``min_freq`` and ``max_freq`` in the
order that keeps min ≤ max at every step and reads both back; restoring writes back what
was found.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_client.devices.base import DeviceError, DevicePermissionError

log = logging.getLogger(__name__)

# devfreq node → board generation (DESIGN §4); used when of_node/name is missing.
KNOWN_GPU_NODES = {
    "57000000.gpu": "Nano / TX1 (JetPack 4)",
    "17000000.gp10b": "TX2",
    "17000000.gv11b": "Xavier",
    "17000000.ga10b": "Orin (JetPack 5)",
    "17000000.gpu": "Orin (JetPack 6)",
}
GPU_OF_NODE_NAMES = ("gpu", "gm20b", "gp10b", "gv11b", "ga10b")

Writer = Callable[[Path, str], None]


def write_sysfs(path: Path, value: str) -> None:
    """Write one sysfs attribute (the only place this backend writes to the hardware)."""
    with open(path, "w") as fh:
        fh.write(value)


class SysfsFormatError(DeviceError, ValueError):
    """A sysfs file whose content is not what the kernel writes there; names the file."""


def read_text(path: Path) -> str:
    """The text of one sysfs or procfs file, without NULs and outer white space."""
    return path.read_text().replace("\x00", "").strip()


def _parse_int(path: Path, token: str, text: str) -> int:
    try:
        return int(token)
    except ValueError:
        raise SysfsFormatError(f"{path}: expected an integer, got {text[:60]!r}") from None


def read_int(path: Path) -> int:
    """The integer a sysfs file holds; some attributes carry a unit after it ("32760 ma")."""
    text = read_text(path)
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
            return read_text(entry / rel)
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
        text = read_text(path)
        freqs = sorted({_parse_int(path, tok, text) for tok in text.split()})
        if not freqs:
            raise DeviceError(f"{path} lists no frequencies")
        return tuple(freqs)

    def cur_freq_hz(self) -> int:
        return read_int(self.node / "cur_freq")

    def read_settings(self) -> DevfreqSettings:
        governor_path = self.node / "governor"
        governor = read_text(governor_path) if governor_path.exists() else None
        return DevfreqSettings(
            read_int(self.node / "min_freq"), read_int(self.node / "max_freq"), governor
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
                hz_to_mhz(freq_hz),
                hz_to_mhz(after.min_freq_hz),
                hz_to_mhz(after.max_freq_hz),
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


def hz_to_mhz(freq_hz: int) -> float:
    """A devfreq frequency (Hz) in MHz."""
    return freq_hz / 1_000_000
