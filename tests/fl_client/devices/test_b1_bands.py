"""B1's safe frequency bands live on the device descriptor (``DeviceInfo``) for every backend:
the twin's spec, a real Jetson's and a replay table's kind descriptor, none for NVML."""

from __future__ import annotations

import ast
import logging
import math
from pathlib import Path

import pytest

from fl_client.devices import B1Band, DeviceInfo, base, open_device
from fl_client.devices.descriptors import (
    DeviceSpecError,
    descriptor_b1_bands,
    device_config_dir,
    load_device_spec,
)
from fl_client.devices.replay import ReplayDevice, ReplayRow, ReplayTable

NANO_MHZ = tuple(round(76.8 * k, 1) for k in range(1, 13))
NANO_BANDS = (B1Band(4.5, 307.2), B1Band(7.0, 614.4), B1Band(math.inf, 921.6))
DEVICES_DIR = Path(__file__).resolve().parents[3] / "fl_client" / "devices"
#: What the device layer must never import (an import-linter contract checks it too).
FORBIDDEN = (
    "fl_client.task",
    "fl_client.selector",
    "fl_client.profiler",
    "fl_client.node",
    "fl_client.settings",
    "torch",
    "flwr",
)


def info(bands: tuple[B1Band, ...] = NANO_BANDS, **kw: object) -> DeviceInfo:
    fields: dict[str, object] = {
        "kind": "jetson-nano",
        "backend": "jetson",
        "knob_values": NANO_MHZ,
        "memory_bytes": 1,
        "power_rail": "POM_5V_IN",
        "b1_bands": bands,
    }
    return DeviceInfo(**{**fields, **kw})  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def fresh_no_bands_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_NO_BANDS_LOGGED", set())


@pytest.mark.parametrize(
    ("p_max_w", "expected_mhz"),
    [(4.5, 307.2), (5.0, 307.2), (6.99, 307.2), (7.0, 614.4), (20.0, 614.4)],
)
def test_band_with_largest_lower_bound_applies(p_max_w: float, expected_mhz: float):
    assert info().b1_max_knob_value(p_max_w) == expected_mhz


def test_no_cap_is_inf_or_none():
    assert info().b1_max_knob_value(math.inf) == 921.6
    assert info().b1_max_knob_value(None) == 921.6


def test_cap_below_every_band_is_an_error_naming_the_bands():
    with pytest.raises(
        ValueError, match=r"p-max-w: 4 W is below the lowest B1 band of jetson-nano"
    ):
        info().b1_max_knob_value(4.0)
    with pytest.raises(ValueError, match=r"bands: ≥4\.5 W → 307\.2 MHz, .*no cap → 921\.6 MHz"):
        info().b1_max_knob_value(1.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, "x"])
def test_bad_cap_names_the_key(bad: object):
    with pytest.raises(ValueError, match=r"^p-max-w: (must be > 0 W|expected a number of watts)"):
        info().b1_max_knob_value(bad)  # type: ignore[arg-type]


def test_band_frequency_is_taken_down_to_the_devices_table():
    coarse = info(knob_values=(76.8, 230.4, 460.8, 921.6))  # e.g. a sparse replay table
    assert coarse.b1_max_knob_value(4.5) == 230.4
    assert coarse.b1_max_knob_value(7.0) == 460.8
    assert coarse.b1_max_knob_value(math.inf) == 921.6
    high = info(knob_values=(460.8, 921.6))
    with pytest.raises(ValueError, match=r"307\.2 MHz is below every frequency"):
        high.b1_max_knob_value(4.5)


def test_no_bands_means_highest_frequency_said_once(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, logger="fl_client.devices.base")
    plain = info(bands=(), kind="rtx-4090", backend="nvml", knob_values=(210.0, 2520.0))
    assert plain.b1_max_knob_value(math.inf) == 2520.0
    assert plain.b1_max_knob_value(100.0) == 2520.0
    with pytest.raises(ValueError, match="p-max-w"):
        plain.b1_max_knob_value(-3.0)
    assert caplog.text.count("no frequency bands known for rtx-4090") == 1


def test_bands_must_ascend():
    with pytest.raises(ValueError, match="must ascend"):
        info(bands=(B1Band(7.0, 614.4), B1Band(4.5, 307.2)))
    with pytest.raises(ValueError, match="invalid band"):
        info(bands=(B1Band(math.nan, 307.2),))


def test_twin_info_carries_its_specs_bands():
    for kind in ("jetson-nano", "jetson-orin-nano", "jetson-agx-orin", "jetson-tx2-nx"):
        spec = load_device_spec(kind)
        dev = open_device(kind, "simulated")
        assert dev.info.b1_bands == spec.b1_freq_caps
        for cap in (*spec.suggested_caps_w, math.inf):
            assert dev.info.b1_max_knob_value(cap) == spec.b1_max_knob_value(cap)


def test_descriptor_bands_for_any_kind(tmp_path: Path):
    assert descriptor_b1_bands("jetson-nano") == NANO_BANDS
    assert descriptor_b1_bands("jetson-tx2") == ()  # no descriptor: no bands
    assert descriptor_b1_bands("") == ()
    assert descriptor_b1_bands("jetson-nano", tmp_path / "missing") == ()
    broken = (device_config_dir() / "jetson-nano.toml").read_text()
    (tmp_path / "jetson-nano.toml").write_text(broken.replace("freq-mhz = 307.2", "freq-mhz = 1"))
    with pytest.raises(DeviceSpecError, match=r"b1-freq-caps\[0\]\.freq-mhz: 1 MHz is not"):
        descriptor_b1_bands("jetson-nano", tmp_path)


def replay_device(kind: str, freqs_mhz: tuple[float, ...]) -> ReplayDevice:
    rows = tuple(ReplayRow(8, f, 0.1, 5.0, 4.0) for f in freqs_mhz)
    return ReplayDevice([ReplayTable(kind, "cnn", None, rows, memory_bytes=1)], kind)


def test_replay_takes_bands_from_its_kinds_descriptor():
    dev = replay_device("jetson-nano", (76.8, 307.2, 460.8, 921.6))
    assert dev.info.b1_bands == NANO_BANDS
    assert dev.info.b1_max_knob_value(7.0) == 460.8  # 614.4 is not in the table: next below
    other = replay_device("my-board", (100.0, 200.0))
    assert other.info.b1_bands == () and other.info.b1_max_knob_value(5.0) == 200.0


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_devices_know_nothing_of_ml_or_policy():
    """No module of fl_client/devices imports the task, policy, node, torch or flwr."""
    bad = {
        f"{path.name}: {name}"
        for path in sorted(DEVICES_DIR.glob("*.py"))
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    }
    assert not bad, sorted(bad)


@pytest.mark.parametrize(
    ("caps_w", "floor_mhz"),
    [
        ((4.5,), 307.2),  # the lowest cap's band
        ((7.0, None), 614.4),  # a schedule's caps: no cap counts as the top band
        ((None, 5.0, 7.0), 307.2),
        ((None,), 921.6),
        ((3.0, 7.0), 0.0),  # a cap below every band: no floor
        ((), 0.0),
    ],
)
def test_profile_floor_is_b1s_band_frequency_for_the_lowest_cap(
    caps_w: tuple[float | None, ...], floor_mhz: float
) -> None:
    assert info().profile_floor_mhz(caps_w) == floor_mhz


def test_no_bands_means_no_profile_floor(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert info(bands=()).profile_floor_mhz([4.5]) == 0.0
    assert caplog.text == ""  # not B1's "no bands" warning: profiling just has no floor
