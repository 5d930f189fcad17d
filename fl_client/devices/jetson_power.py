"""Jetson board power: the INA3221 monitor in sysfs, or the jtop service as a fallback.

INA3221 chips lie under ``/sys/bus/i2c/devices`` (JetPack ≤ 4 iio, JetPack ≥ 5 hwmon); the
cap applies to the board's input rail (``VDD_IN`` / ``POM_5V_IN``), or to the sum of all
connected rails on boards without one (AGX Xavier, AGX Orin). ``jtop`` (jetson-stats) reads
power only; it cannot set the GPU frequency. Paths are taken under a root, as in
``fl_client.devices.jetson_sysfs``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fl_client.devices.base import DeviceError, DeviceUnavailableError
from fl_client.devices.jetson_sysfs import read_int, read_text, sysfs_root
from fl_client.devices.names import POWER_SOURCES

# Rails that carry the whole board's input power, in order of preference.
BOARD_RAILS = ("VDD_IN", "POM_5V_IN")
SKIPPED_RAIL_LABELS = ("nc", "sum of shunt voltages")
# jtop's service refreshes at its own interval; asking it for more than 10 Hz costs CPU only.
JTOP_MIN_INTERVAL_S = 0.1


@dataclass(frozen=True)
class PowerRail:
    """One INA3221 channel: power file (iio, mW) or voltage (mV) × current (mA)."""

    name: str
    power_path: Path | None = None
    voltage_path: Path | None = None
    current_path: Path | None = None

    def read_power_w(self) -> float:
        if self.power_path is not None:
            return read_int(self.power_path) / 1000.0
        assert self.voltage_path is not None and self.current_path is not None
        return read_int(self.voltage_path) * read_int(self.current_path) / 1e6


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
        return read_text(path)
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
            if "ina3221" not in read_text(chip / "name"):
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
