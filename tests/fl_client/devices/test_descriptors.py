"""Device descriptors: the shipped twins, the config folder, and every malformed key named."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from fl_client.devices.descriptors import (
    CONFIG_DIR_ENV,
    DEVICE_KINDS,
    DeviceSpec,
    DeviceSpecError,
    available_device_kinds,
    device_config_dir,
    load_device_spec,
)
from fl_client.devices.simulated import suggested_caps_w

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "configs" / "devices"


@pytest.fixture(autouse=True)
def _shipped_descriptors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``$POWERFL_CONFIG_DIR`` of the caller's shell must not leak into these tests."""
    monkeypatch.delenv(CONFIG_DIR_ENV, raising=False)


@pytest.fixture(scope="module")
def specs() -> dict[str, DeviceSpec]:
    return {kind: load_device_spec(kind, SHIPPED) for kind in DEVICE_KINDS}


def test_shipped_kinds_and_real_frequency_tables(specs: dict[str, DeviceSpec]) -> None:
    assert available_device_kinds() == tuple(sorted(DEVICE_KINDS))
    assert device_config_dir() == SHIPPED
    nano = specs["jetson-nano"].gpu_freqs_mhz
    assert len(nano) == 12
    assert nano == pytest.approx([76.8 * k for k in range(1, 13)])
    for kind in ("jetson-tx2-nx", "jetson-agx-orin"):
        table = specs[kind].gpu_freqs_mhz
        assert (table[0], table[-1], len(table)) == (114.75, 1300.5, 13)
    assert specs["jetson-orin-nano"].gpu_freqs_mhz == (306, 408, 510, 612, 714, 816, 918, 1020)
    assert specs["jetson-nano"].power_rail == "POM_5V_IN"
    assert specs["jetson-tx2-nx"].power_rail == "VDD_IN"
    assert specs["jetson-orin-nano"].power_rail == "VDD_IN"
    for kind, spec in specs.items():
        assert spec.kind == kind
        assert spec.memory_bytes > 2**30
        assert math.isinf(spec.suggested_caps_w[-1])
        assert math.isinf(spec.b1_freq_caps[-1].min_p_max_w)
        assert spec.b1_freq_caps[-1].freq_mhz == spec.max_freq_mhz
        assert suggested_caps_w(spec) == spec.suggested_caps_w


def test_unknown_kind_names_the_key_and_the_allowed_kinds() -> None:
    with pytest.raises(ValueError, match=r"device: unknown device kind 'jetson-tx1'") as err:
        load_device_spec("jetson-tx1")
    for kind in DEVICE_KINDS:
        assert kind in str(err.value)


def test_config_dir_from_env_and_missing_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = SHIPPED / "jetson-nano.toml"
    text = src.read_text().replace('kind = "jetson-nano"', 'kind = "my-nano"')
    (tmp_path / "my-nano.toml").write_text(text)
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path))
    assert available_device_kinds() == ("my-nano",)
    assert load_device_spec("my-nano").gpu_freqs_mhz[-1] == 921.6
    with pytest.raises(ValueError, match="allowed: my-nano"):
        load_device_spec("jetson-nano")
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=CONFIG_DIR_ENV):
        load_device_spec("my-nano")


NANO_TOML = (SHIPPED / "jetson-nano.toml").read_text()


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("idle-w = 1.25", "", r"power\.idle-w: missing"),
        ("idle-w = 1.25", "idle-w = -1.0", r"power\.idle-w: must be a finite number > 0"),
        ("idle-w = 1.25", 'idle-w = "1.25"', r"power\.idle-w: expected a number"),
        ("avg-to-peak = 0.93", "avg-to-peak = 1.5", r"power\.avg-to-peak: .*≤ 1"),
        ("idle-w = 1.25", "idle-w = 1.25\nidle-watts = 1.0", r"power\.idle-watts: unknown key"),
        ('kind = "jetson-nano"', 'kind = "jetson-tx2-nx"', r"kind: .*does not match"),
        ("[76.8, 153.6,", "[153.6, 76.8,", r"gpu-freqs-mhz: must be strictly ascending"),
        ("freq-mhz = 307.2", "freq-mhz = 300.0", r"b1-freq-caps\[0\]\.freq-mhz: 300 MHz is not"),
        ("min-p-max-w = inf", "min-p-max-w = 12.0", r"b1-freq-caps: the last band"),
        ("memory-bytes = 4_148_256_768", "memory-bytes = 4.1e9", r"memory-bytes: expected a"),
        ("[sensor]", "[sensors]", r"sensor: missing"),
        (
            "[nvpmodel-budgets-w]",
            "nvpmodel-budgets-w = 5.0\n[nvpmodel-budgets-x]",
            r"nvpmodel-budgets-w: expected a table",
        ),
        ("[power]", "[power", r"not valid TOML"),
        ("min-power-samples = 10", "min-power-samples = 0", r"sensor\.min-power-samples: exp"),
        ("min-window-s = 0.5", "min-window-s = -1", r"sensor\.min-window-s: must be a finite"),
        ("min-window-s = 0.5", "min-windw-s = 0.5", r"sensor\.min-windw-s: unknown key.*min-w"),
        ("update-period-s = 0.0066", "update-period-s = 0", r"sensor\.update-period-s: must"),
    ],
)
def test_malformed_descriptor_errors_name_file_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old: str, new: str, message: str
) -> None:
    assert old in NANO_TOML
    (tmp_path / "jetson-nano.toml").write_text(NANO_TOML.replace(old, new, 1))
    monkeypatch.setenv(CONFIG_DIR_ENV, str(tmp_path))
    with pytest.raises(DeviceSpecError, match=message) as err:
        load_device_spec("jetson-nano")
    assert str(tmp_path / "jetson-nano.toml") in str(err.value)


def test_module_imports_with_tomli_on_python_3_10(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``sys.version_info`` guard: on 3.10 the module reads TOML with ``tomli``."""
    pytest.importorskip("tomli")
    path = REPO / "fl_client" / "devices" / "descriptors.py"
    module_spec = importlib.util.spec_from_file_location("_descriptors_py310", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    monkeypatch.setitem(sys.modules, "_descriptors_py310", module)  # dataclasses look it up
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    module_spec.loader.exec_module(module)
    assert module.tomllib.__name__ == "tomli"
    assert module.load_device_spec("jetson-nano").max_freq_mhz == 921.6
