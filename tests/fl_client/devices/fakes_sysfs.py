"""Fake Jetson sysfs trees under a temporary root, with the boards' real frequency tables.

Layouts follow the boards: the devfreq folder lives under ``sys/devices/...`` and is linked
from ``sys/class/devfreq``; ``device`` and ``of_node`` are links, and the device-tree
``name`` ends in a NUL byte as on hardware. INA3221 chips sit under ``sys/bus/i2c/devices``
as iio (JetPack ≤ 4: ``rail_name_N``, ``in_powerN_input`` in mW) or hwmon (JetPack ≥ 5:
``inN_label``, ``inN_input`` in mV, ``currN_input`` in mA, with ``NC`` channels and the
"sum of shunt voltages" channel 7).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Channel:
    label: str
    voltage_mv: int
    current_ma: int

    @property
    def power_w(self) -> float:
        return self.voltage_mv * self.current_ma / 1e6


@dataclass(frozen=True)
class Chip:
    bus_addr: str  # e.g. "1-0040"
    driver_name: str  # "ina3221x" (JetPack 4) or "ina3221" (JetPack 5+)
    style: str  # "iio" | "hwmon"
    folder: str  # "iio:device0" | "hwmon/hwmon3"
    channels: tuple[Channel, ...]


@dataclass(frozen=True)
class Board:
    key: str
    kind: str
    model: str
    devfreq_name: str
    of_node_name: str
    device_dir: str  # under sys/devices
    dt_node: str  # under sys/firmware/devicetree/base
    freqs_hz: tuple[int, ...]
    governor: str
    meminfo_kb: int
    chips: tuple[Chip, ...]
    board_rail: str  # what the backend should report as power_rail
    board_channels: tuple[str, ...]  # the rails whose sum is board power
    decoys: tuple[tuple[str, str], ...] = field(default=())  # other devfreq nodes (name, of_node)

    @property
    def freqs_mhz(self) -> tuple[float, ...]:
        return tuple(f / 1_000_000 for f in self.freqs_hz)

    @property
    def board_power_w(self) -> float:
        chans = {c.label: c for chip in self.chips for c in chip.channels}
        return sum(chans[name].power_w for name in self.board_channels)


def _hz(*mhz_x1000: int) -> tuple[int, ...]:
    return tuple(k * 1000 for k in mhz_x1000)


NANO_HZ = tuple(76_800_000 * k for k in range(1, 13))  # 76.8 … 921.6 MHz
TX2_HZ = _hz(
    140250, 229500, 318750, 408000, 497250, 586500, 675750,
    765000, 854250, 943500, 1032750, 1122000, 1211250, 1300500,
)  # fmt: skip
XAVIER_NX_HZ = _hz(
    114750, 204000, 306000, 408000, 510000, 599250, 701250, 752250,
    803250, 854250, 905250, 956250, 1007250, 1058250, 1109250,
)  # fmt: skip
AGX_ORIN_HZ = _hz(
    114750, 216750, 318750, 420750, 522750, 624750, 726750,
    828750, 930750, 1032750, 1134750, 1236750, 1300500,
)  # fmt: skip
ORIN_NANO_HZ = _hz(306000, 408000, 510000, 612000, 714000, 816000, 918000, 1020000)

_SUM = Channel("sum of shunt voltages", 0, 0)

BOARDS: dict[str, Board] = {
    b.key: b
    for b in (
        Board(
            key="nano-jp4",
            kind="jetson-nano",
            model="NVIDIA Jetson Nano Developer Kit",
            devfreq_name="57000000.gpu",
            of_node_name="gpu",
            device_dir="57000000.gpu",
            dt_node="gpu@57000000",
            freqs_hz=NANO_HZ,
            governor="nvhost_podgov",
            meminfo_kb=4_051_032,
            chips=(
                Chip(
                    "6-0040",
                    "ina3221x",
                    "iio",
                    "iio:device0",
                    (
                        Channel("POM_5V_IN", 5_080, 620),
                        Channel("POM_5V_GPU", 5_064, 210),
                        Channel("POM_5V_CPU", 5_072, 130),
                    ),
                ),
            ),
            board_rail="POM_5V_IN",
            board_channels=("POM_5V_IN",),
        ),
        Board(
            key="tx2-jp4",
            kind="jetson-tx2",
            model="quill",
            devfreq_name="17000000.gp10b",
            of_node_name="gp10b",
            device_dir="17000000.gp10b",
            dt_node="gp10b@17000000",
            freqs_hz=TX2_HZ,
            governor="nvhost_podgov",
            meminfo_kb=8_038_596,
            chips=(
                Chip(
                    "0-0040",
                    "ina3221x",
                    "iio",
                    "iio:device0",
                    (
                        Channel("VDD_SYS_GPU", 19_024, 95),
                        Channel("VDD_SYS_SOC", 19_032, 40),
                        Channel("VDD_4V0_WIFI", 4_992, 10),
                    ),
                ),
                Chip(
                    "0-0041",
                    "ina3221x",
                    "iio",
                    "iio:device1",
                    (
                        Channel("VDD_IN", 19_008, 310),
                        Channel("VDD_SYS_CPU", 19_040, 30),
                        Channel("VDD_SYS_DDR", 4_976, 120),
                    ),
                ),
            ),
            board_rail="VDD_IN",
            board_channels=("VDD_IN",),
        ),
        Board(
            key="xavier-nx-jp5",
            kind="jetson-xavier-nx",
            model="NVIDIA Jetson Xavier NX Developer Kit",
            devfreq_name="17000000.gv11b",
            of_node_name="gv11b",
            device_dir="17000000.gv11b",
            dt_node="gv11b@17000000",
            freqs_hz=XAVIER_NX_HZ,
            governor="nvhost_podgov",
            meminfo_kb=7_765_316,
            chips=(
                Chip(
                    "7-0040",
                    "ina3221",
                    "hwmon",
                    "hwmon/hwmon3",
                    (
                        Channel("VDD_IN", 5_016, 1_380),
                        Channel("VDD_CPU_GPU_CV", 5_008, 520),
                        Channel("VDD_SOC", 5_000, 410),
                    ),
                ),
            ),
            board_rail="VDD_IN",
            board_channels=("VDD_IN",),
        ),
        Board(
            key="agx-orin-jp5",
            kind="jetson-agx-orin",
            model="Jetson AGX Orin Developer Kit",
            devfreq_name="17000000.ga10b",
            of_node_name="ga10b",
            device_dir="platform/17000000.ga10b",
            dt_node="ga10b@17000000",
            freqs_hz=AGX_ORIN_HZ,
            governor="nvhost_podgov",
            meminfo_kb=31_992_064,
            chips=(
                Chip(
                    "1-0040",
                    "ina3221",
                    "hwmon",
                    "hwmon/hwmon3",
                    (
                        Channel("VDD_GPU_SOC", 19_968, 520),
                        Channel("VDD_CPU_CV", 19_968, 180),
                        Channel("VIN_SYS_5V0", 4_984, 720),
                    ),
                ),
                Chip(
                    "1-0041",
                    "ina3221",
                    "hwmon",
                    "hwmon/hwmon4",
                    (
                        Channel("NC", 0, 0),
                        Channel("VDDQ_VDD2_1V8AO", 4_992, 150),
                        Channel("NC", 0, 0),
                    ),
                ),
            ),
            board_rail="sum(VDD_GPU_SOC+VDD_CPU_CV+VIN_SYS_5V0+VDDQ_VDD2_1V8AO)",
            board_channels=("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"),
            decoys=(("15340000.vic", "vic"), ("15480000.nvdec", "nvdec")),
        ),
        Board(
            key="orin-nano-jp6",
            kind="jetson-orin-nano",
            model="NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
            devfreq_name="17000000.gpu",
            of_node_name="gpu",
            device_dir="platform/bus@0/17000000.gpu",
            dt_node="bus@0/gpu@17000000",
            freqs_hz=ORIN_NANO_HZ,
            governor="nvhost_podgov",
            meminfo_kb=7_802_808,
            chips=(
                Chip(
                    "1-0040",
                    "ina3221",
                    "hwmon",
                    "hwmon/hwmon1",
                    (
                        Channel("VDD_IN", 5_040, 1_610),
                        Channel("VDD_CPU_GPU_CV", 5_032, 640),
                        Channel("VDD_SOC", 5_024, 330),
                    ),
                ),
            ),
            board_rail="VDD_IN",
            board_channels=("VDD_IN",),
            decoys=(("15340000.vic", "vic"), ("15810000.nvdla0", "nvdla0")),
        ),
    )
}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


class FakeJetson:
    """A board's sysfs tree under ``root``; read and poke its files from tests."""

    def __init__(self, root: Path, board: Board) -> None:
        self.root = root
        self.board = board
        self.class_node = root / "sys" / "class" / "devfreq" / board.devfreq_name
        self.node = root / "sys" / "devices" / board.device_dir / "devfreq" / board.devfreq_name

    def read_hz(self, name: str) -> int:
        return int((self.node / name).read_text().split()[0])

    @property
    def min_hz(self) -> int:
        return self.read_hz("min_freq")

    @property
    def max_hz(self) -> int:
        return self.read_hz("max_freq")

    def set_limits_hz(self, min_hz: int, max_hz: int) -> None:
        (self.node / "min_freq").write_text(f"{min_hz}\n")
        (self.node / "max_freq").write_text(f"{max_hz}\n")

    def set_channel(self, label: str, voltage_mv: int, current_ma: int) -> None:
        """Change what one INA3221 channel reads."""
        for chip in self.board.chips:
            for n, ch in enumerate(chip.channels):
                if ch.label == label:
                    _write_channel(self.root, chip, n, Channel(label, voltage_mv, current_ma))
                    return
        raise KeyError(label)


def _write_channel(root: Path, chip: Chip, n: int, ch: Channel) -> None:
    folder = root / "sys" / "bus" / "i2c" / "devices" / chip.bus_addr / chip.folder
    if chip.style == "iio":
        _write(folder / f"rail_name_{n}", f"{ch.label}\n")
        _write(folder / f"in_voltage{n}_input", f"{ch.voltage_mv}\n")
        _write(folder / f"in_current{n}_input", f"{ch.current_ma}\n")
        _write(folder / f"in_power{n}_input", f"{ch.voltage_mv * ch.current_ma // 1000}\n")
        _write(folder / f"crit_current_limit_{n}", "3000\n")
    else:
        i = n + 1
        _write(folder / f"in{i}_label", f"{ch.label}\n")
        _write(folder / f"in{i}_input", f"{ch.voltage_mv}\n")
        _write(folder / f"curr{i}_input", f"{ch.current_ma}\n")
        _write(folder / f"curr{i}_max", "32760 ma\n")
        _write(folder / f"in{i + 3}_input", "12\n")  # shunt voltage channels 4-6


def build_tree(root: Path, key: str, *, with_power: bool = True) -> FakeJetson:
    """Build the sysfs tree of board ``key`` (one of ``BOARDS``) under ``root``."""
    board = BOARDS[key]
    fake = FakeJetson(root, board)
    dev = root / "sys" / "devices" / board.device_dir
    dt = root / "sys" / "firmware" / "devicetree" / "base" / board.dt_node
    _write(dt / "name", board.of_node_name + "\x00")
    _link(dev / "of_node", dt)
    node = fake.node
    _write(node / "available_frequencies", " ".join(map(str, board.freqs_hz)) + " \n")
    _write(node / "cur_freq", f"{board.freqs_hz[-1]}\n")
    _write(node / "min_freq", f"{board.freqs_hz[0]}\n")
    _write(node / "max_freq", f"{board.freqs_hz[-1]}\n")
    _write(node / "governor", f"{board.governor}\n")
    _write(node / "available_governors", f"{board.governor} performance simple_ondemand\n")
    _link(node / "device", dev)
    _link(fake.class_node, node)
    for name, of_name in board.decoys:
        ddev = root / "sys" / "devices" / "platform" / name
        dnode = ddev / "devfreq" / name
        _write(dnode / "available_frequencies", "115200000 729600000\n")
        _write(dnode / "cur_freq", "729600000\n")
        _write(dnode / "min_freq", "115200000\n")
        _write(dnode / "max_freq", "729600000\n")
        _write(ddev / "of_node" / "name", of_name + "\x00")
        _link(dnode / "device", ddev)
        _link(root / "sys" / "class" / "devfreq" / name, dnode)
    _write(root / "proc" / "device-tree" / "model", board.model + "\x00")
    _write(root / "proc" / "meminfo", f"MemTotal:       {board.meminfo_kb} kB\nMemFree: 1 kB\n")
    if with_power:
        for chip in board.chips:
            chip_dir = root / "sys" / "bus" / "i2c" / "devices" / chip.bus_addr
            _write(chip_dir / "name", chip.driver_name + "\n")
            for n, ch in enumerate(chip.channels):
                _write_channel(root, chip, n, ch)
            if chip.style == "hwmon":
                folder = chip_dir / chip.folder
                _write(folder / "in7_label", _SUM.label + "\n")
                _write(folder / "in7_input", "40\n")
                _write(folder / "curr7_input", "400\n")
                _write(folder / "name", "ina3221\n")
        # A non-INA3221 i2c device that discovery must skip.
        _write(root / "sys" / "bus" / "i2c" / "devices" / "2-0050" / "name", "eeprom\n")
    return fake
