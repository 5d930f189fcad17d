"""The settings table: each key declared once, and everything else agrees with it."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from fl_client import settings_table
from fl_client.contract import Cap, SettingsError
from fl_client.devices import DeviceOptions
from fl_client.setting_checks import (
    Choice,
    Flag,
    Integer,
    Number,
    OptionalNumber,
    PathText,
    Range,
    SafeName,
    TrackingURI,
)
from fl_client.settings import RunSettings, node_entry_keys, node_settings
from fl_client.settings_table import (
    DEVICE_OPTION_SETTINGS,
    NODE,
    NODE_SETTINGS,
    RUN,
    RUN_SETTINGS,
    check_run_keys,
    device_options,
    parse_settings,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _app_config() -> dict[str, Any]:
    """``[tool.flwr.app.config]`` of the repository's pyproject.toml, read here directly."""
    data = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    return dict(data["tool"]["flwr"]["app"]["config"])


def test_pyproject_holds_exactly_the_tables_keys_and_defaults() -> None:
    """A key added to one and not the other, or a default changed in one, fails here."""
    declared = _app_config()
    table = {s.key: s.default for s in RUN_SETTINGS}
    assert sorted(set(table) - set(declared)) == [], "run settings missing from pyproject.toml"
    assert sorted(set(declared) - set(table)) == [], "pyproject.toml keys the table lacks"
    differ = {
        key: (declared[key], table[key])
        for key in table
        if (type(declared[key]), declared[key]) != (type(table[key]), table[key])
    }
    assert differ == {}, "defaults that differ (pyproject.toml, table)"


def test_the_pyproject_check_fails_on_a_drifted_default(monkeypatch: pytest.MonkeyPatch) -> None:
    drifted = dataclasses.replace(RUN["cap-margin"], default=0.1)
    table = tuple(drifted if s.key == "cap-margin" else s for s in RUN_SETTINGS)
    monkeypatch.setattr(sys.modules[__name__], "RUN_SETTINGS", table)
    with pytest.raises(AssertionError, match="cap-margin"):
        test_pyproject_holds_exactly_the_tables_keys_and_defaults()


def test_run_settings_fields_follow_the_table() -> None:
    names = [f.name for f in dataclasses.fields(RunSettings)]
    assert names == [s.field_name for s in RUN_SETTINGS]
    assert RunSettings.keys() == tuple(s.key for s in RUN_SETTINGS)


def test_every_default_passes_its_own_check() -> None:
    settings = RunSettings.from_config({})
    for s in RUN_SETTINGS:
        if s.key == "aggregation":  # "auto" resolves per run: fedbuff for power-aware
            assert (s.value, settings.aggregation) == ("auto", "fedbuff")
            continue
        assert getattr(settings, s.field_name) == s.value, s.key


def test_node_keys_are_the_fleet_entry_keys_and_device_options_defaults() -> None:
    assert tuple(s.key for s in NODE_SETTINGS) == node_entry_keys()
    options = {f.name.replace("_", "-"): f.default for f in dataclasses.fields(DeviceOptions)}
    assert set(options) <= set(NODE)
    for key, default in options.items():
        assert NODE[key].default == default, key
    assert NODE["cap-margin"] is RUN["cap-margin"]  # one declaration, run and node
    assert RUN["cap-margin"].scope == "run+node"


def test_every_entry_says_who_reads_it_and_where_it_is_set() -> None:
    for s in (*RUN_SETTINGS, *NODE_SETTINGS):
        assert s.read_by in ("server", "node", "both"), s.key
        assert s.scope in ("run", "node", "run+node"), s.key
        assert s.doc.strip() and s.key == s.key.lower() and "_" not in s.key
    assert {s.scope for s in RUN_SETTINGS} <= {"run", "run+node"}
    assert {s.scope for s in NODE_SETTINGS} <= {"node", "run+node"}


@pytest.mark.parametrize(
    ("check", "good", "bad", "message"),
    [
        (Range(0.0, 1.0), (0, 0.0), 1.0, "expected a number in [0, 1), got 1.0"),
        (Range(0.0, 1.0), ("0.5", 0.5), True, "expected a number in [0, 1), got True"),
        (Range(0.0, 1.0, hi_open=False), (1, 1.0), -0.1, "expected a number in [0, 1]"),
        (Range(0.0, 1.0, lo_open=True, hi_open=False), (1.0, 1.0), 0, "in (0, 1], got 0"),
        (Range(0.0, math.inf), (2, 2.0), math.inf, "expected a finite number ≥ 0, got inf"),
        (Number(lo=0.0), ("3", 3.0), 0, "must be a finite number > 0.0, got 0"),
        (Number(lo=0.0), (1e300, 1e300), math.inf, "must be a finite number > 0.0, got inf"),
        (Number(lo=0.0, inf_ok=True), ("inf", math.inf), -math.inf, "must be > 0.0, got -inf"),
        (Number(lo=0.0, inf_ok=True), (5, 5.0), math.nan, "must be > 0.0, got nan"),
        (Number(lo=0.0, hi=1.0), (1, 1.0), "x", "expected a number, got 'x'"),
        (Number(lo=0.0, hi=1.0), (0.5, 0.5), 1.5, "must be in (0.0, 1.0], got 1.5"),
        (Integer(lo=1), ("3", 3), 1.5, "expected an integer ≥ 1, got 1.5"),
        (Integer(lo=0), (3.0, 3), True, "expected an integer ≥ 0, got True"),
        (Integer(lo=0), (0, 0), math.inf, "expected an integer ≥ 0, got inf"),
        (SafeName(), ("nano-1", "nano-1"), "../x", "'../x' cannot be used as a name"),
        (Flag(), ("TRUE", True), 1, "expected true or false, got 1"),
        (Choice(("a", "b")), ("b", "b"), "c", "unknown value 'c'; allowed: a, b"),
        (OptionalNumber("a batch size ≥ 1", integer=True), (0, None), 1.5, "(0: not set)"),
        (OptionalNumber("a batch size ≥ 1", integer=True), ("8", 8), "8.0", "got '8.0'"),
        (OptionalNumber("a frequency > 0"), (921.6, 921.6), -1, "a frequency > 0 (0: not set)"),
        (PathText(), (" a/b ", "a/b"), 3, "expected a path (a string), got 3"),
        (TrackingURI(), (" http://host:5000 ", "http://host:5000"), "runs/x", "got 'runs/x'"),
        (TrackingURI(), ("", ""), "sqlite:///a b", "a URI with its scheme"),
    ],
)
def test_a_check_validates_and_names_the_key(
    check: Any, good: tuple[object, object], bad: object, message: str
) -> None:
    assert check.parse("k", good[0]) == good[1]
    with pytest.raises(SettingsError, match=re.escape("k: ") + ".*" + re.escape(message)):
        check.parse("k", bad)


def test_a_check_says_what_it_allows() -> None:
    assert RUN["cap-margin"].check.allowed() == "a number in [0, 1)"
    assert RUN["straggler-work"].check.allowed() == "a number in (0, 1]"
    assert RUN["peak-sigma-k"].check.allowed() == "a finite number ≥ 0"
    assert RUN["lr-ref"].check.allowed() == "a finite number > 0.0"
    assert RUN["round-timeout-s"].check.allowed() == "> 0.0"  # inf: no timeout
    assert NODE["name"].check.allowed().startswith("1 to 64 letters, digits")
    assert NODE["partition-id"].check.allowed() == "an integer ≥ 0"
    assert (
        RUN["aggregation"].check.allowed()
        == "`auto` \\| `fedavg` \\| `fednova` \\| `fedavg-capped` \\| `fedbuff`"
    )
    assert RUN["balance"].check.allowed().count("`") == 2 * len(settings_table.BALANCE_MODES)
    assert NODE["p-max-w"].parse("4.5") == Cap(4.5)
    assert NODE["p-max-w"].check.allowed() == "> 0 W (or 'none' for no cap)"


def test_device_option_entries_are_checked_by_the_device_options() -> None:
    assert NODE["cap-window-s"].parse(2) == 2
    with pytest.raises(SettingsError, match=r"cap-window-s: expected a finite number > 0, got 0"):
        NODE["cap-window-s"].parse(0)
    with pytest.raises(SettingsError, match=r"knob: unknown value 'volts'"):
        NODE["knob"].parse("volts")


def test_parsing_a_table_refuses_unknown_keys_with_a_hint() -> None:
    table = (RUN["cap-margin"], RUN["tie-tolerance"])
    assert parse_settings({"cap-margin": "0.1"}, table, "here") == {
        "cap_margin": 0.1,
        "tie_tolerance": RUN["tie-tolerance"].value,
    }
    with pytest.raises(SettingsError, match=r"here: unknown key 'cap-margn' \(did you mean"):
        parse_settings({"cap-margn": 0.1}, table, "here")


def test_overrides_are_checked_against_the_run_settings() -> None:
    check_run_keys({"cap-margin": 0.1, "pacing": "off"}, "study", also=("pacing",))
    with pytest.raises(SettingsError, match=r"study: unknown key 'cap-margn' \(did you mean "):
        check_run_keys({"cap-margn": 0.1}, "study")


def test_the_model_choice_is_the_task_modules() -> None:
    from fl_client import model_zoo

    assert settings_table.MODEL_NAMES == model_zoo.MODEL_NAMES


def test_only_round_timeout_takes_inf_among_run_numbers() -> None:
    defaults = settings_table.run_defaults()
    assert RunSettings.from_config({**defaults, "round-timeout-s": math.inf}).round_timeout_s == (
        math.inf
    )
    numbers = [s.key for s in RUN_SETTINGS if isinstance(s.check, Number)]
    assert "lr-ref" in numbers and "drift-threshold" in numbers
    for key in numbers:
        if key != "round-timeout-s":
            with pytest.raises(SettingsError, match=f"^{key}: must be .*, got inf"):
                RunSettings.from_config({**defaults, key: math.inf})


# ------------------------------------------------------------------------------ device options


def test_options_from_node_config():
    opts = device_options(
        {
            "sysfs-root": "/tmp/x",
            "cap-window-s": 0.5,
            "sample-rate-hz": 50,
            "lock-clocks": "false",
            "replay-table": "",
            "nvml-index": "1",
            "power-rails": "VDD_IN, VDD_SOC",
            "power-source": "sysfs",
        }
    )
    assert opts == DeviceOptions(
        sysfs_root="/tmp/x",
        cap_window_s=0.5,
        sample_rate_hz=50.0,
        lock_clocks=False,
        nvml_index=1,
        power_rails=("VDD_IN", "VDD_SOC"),
        power_source="sysfs",
    )
    assert device_options({}) == DeviceOptions()
    # blank is unset: the option's default (sysfs-root, power-source) or none (the rest)
    blank = device_options({"sysfs-root": " ", "power-source": "", "state-dir": "", "knob": ""})
    assert blank == DeviceOptions()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"cap-windw-s": 0.5}, "unknown key 'cap-windw-s' (did you mean cap-window-s?)"),
        ({"sysfs_root": "/"}, "unknown key 'sysfs_root' (did you mean sysfs-root?)"),
        # a node's own settings are not device options: the caller passes only the options
        ({"p-max-w": 4.5}, "unknown key 'p-max-w'; known keys: cap-window-s, knob, lock-clocks"),
    ],
)
def test_unknown_options_are_refused_naming_the_nearest_key(
    config: dict[str, object], message: str
):
    with pytest.raises(ValueError, match=re.escape(f"device options: {message}")):
        device_options(config)


def test_device_option_keys_are_the_fields_in_kebab_case():
    keys = [s.key for s in DEVICE_OPTION_SETTINGS]
    assert keys == [f.name.replace("_", "-") for f in dataclasses.fields(DeviceOptions)]


#: A bad value of every device option that has one (paths and rail names are free text).
BAD_OPTIONS = [
    ("power-source", "tegrastats", "unknown value 'tegrastats'; allowed: auto, sysfs, jtop"),
    ("sample-rate-hz", 0, "expected a finite number > 0, got 0"),
    ("sample-rate-hz", math.inf, "expected a finite number > 0, got inf"),
    ("cap-window-s", -1, "expected a finite number > 0, got -1"),
    ("cap-window-s", "soon", "expected a finite number > 0, got 'soon'"),
    ("nvml-index", "first", "expected an integer ≥ 0, got 'first'"),
    ("nvml-index", -1, "expected an integer ≥ 0, got -1"),
    ("lock-clocks", "maybe", "expected true, false or auto, got 'maybe'"),
    ("knob", "mhz", "unknown value 'mhz'; allowed: frequency, power-limit, auto"),
    ("power-limit-step-w", 0, "expected a finite number > 0, got 0"),
    ("power-rails", 3, "expected names, comma-separated, got 3"),
    ("twin-slowdown", 0.5, "expected a finite number ≥ 1, got 0.5"),
    ("twin-extra-power-w", -1, "expected a finite number ≥ 0, got -1"),
    ("twin-drift-from-round", 0, "expected an integer ≥ 1, got 0"),
    ("twin-drift-from-round", True, "expected an integer ≥ 1, got True"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD_OPTIONS)
def test_bad_options_name_the_key(key: str, value: object, message: str):
    with pytest.raises(SettingsError, match=re.escape(f"{key}: {message}")):
        device_options({key: value})


@pytest.mark.parametrize(("key", "value", "message"), BAD_OPTIONS)
def test_a_bad_node_device_option_is_refused_naming_the_node_and_the_key(
    key: str, value: object, message: str
):
    with pytest.raises(SettingsError, match=re.escape(f"node-config (x): {key}: {message}")):
        node_settings({"name": "x", "device": "jetson-nano", key: value}, None)


def test_power_limit_with_lock_clocks_false_is_refused_naming_both():
    with pytest.raises(SettingsError, match=r"knob: power-limit .* lock-clocks = false"):
        device_options({"lock-clocks": "no", "knob": "power-limit"})
