"""Bad input over every key the settings table declares (``fl_client.settings_table``): each
numeric key refuses inf and NaN naming the key (inf only where its check takes it, as
``round-timeout-s`` does: no timeout), and each key that becomes a file or folder name
refuses ``/``, ``..`` and the empty string. The keys come from the table, so a new key is
covered without a new test."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

import pytest
import tomli_w

from fl_client.contract import SettingsError
from fl_client.setting_checks import SafeName
from fl_client.settings import RunSettings, load_fleet
from fl_client.settings_table import NODE_SETTINGS, RUN_SETTINGS, Setting, run_defaults

#: A fleet entry that is valid on its own: the node key under test is added to it.
NODE_BASE = {"name": "a", "device": "jetson-nano", "p-max-w": 5.0}


def _types(setting: Setting) -> tuple[type, ...]:
    return setting.type if isinstance(setting.type, tuple) else (setting.type,)


def _numeric(settings: tuple[Setting, ...]) -> list[Setting]:
    """Keys that take a number (TOML integer or float, booleans aside)."""
    return [s for s in settings if {int, float} & set(_types(s))]


def _names(settings: tuple[Setting, ...]) -> list[Setting]:
    """Keys whose value becomes part of a file or folder name."""
    return [s for s in settings if isinstance(s.check, SafeName)]


def _takes_inf(setting: Setting) -> bool:
    """Whether the table's check lets ``inf`` mean something (``round-timeout-s``: no
    timeout; ``p-max-w``: no cap)."""
    return bool(getattr(setting.check, "inf_ok", False))


def _cases(settings: list[Setting], values: Mapping[str, object]) -> list[object]:
    return [
        pytest.param(s, value, id=f"{s.key}={label}")
        for s in settings
        for label, value in values.items()
        if not (label == "inf" and _takes_inf(s))
    ]


NON_FINITE = {"inf": math.inf, "nan": math.nan, "-inf": -math.inf}
UNSAFE_NAMES = {"slash": "a/b", "dotdot": "..", "up": "../escaped", "empty": ""}


def _names_the_key(err: SettingsError, key: str) -> None:
    assert re.search(rf"(^|\W){re.escape(key)}\W", str(err)), str(err)


def test_the_table_has_keys_of_each_kind() -> None:
    """The parametrised cases below come from the table: it must hold such keys."""
    run_numbers = {s.key for s in _numeric(RUN_SETTINGS)}
    assert {"lr-ref", "round-timeout-s", "num-rounds", "cap-margin"} <= run_numbers
    node_numbers = {s.key for s in _numeric(NODE_SETTINGS)}
    assert {"cap-window-s", "sample-rate-hz", "partition-id", "num-partitions"} <= node_numbers
    assert "name" in {s.key for s in _names(NODE_SETTINGS)}
    assert [s.key for s in NODE_SETTINGS if _takes_inf(s)] == ["p-max-w"]
    assert [s.key for s in RUN_SETTINGS if _takes_inf(s)] == ["round-timeout-s"]


@pytest.mark.parametrize(
    ("setting", "value"),
    _cases(_numeric(RUN_SETTINGS), NON_FINITE) + _cases(_names(RUN_SETTINGS), UNSAFE_NAMES),
)
def test_a_run_setting_refuses_a_bad_value_naming_its_key(setting: Setting, value: object) -> None:
    with pytest.raises(SettingsError) as err:
        RunSettings.from_config({**run_defaults(), setting.key: value})
    _names_the_key(err.value, setting.key)


@pytest.mark.parametrize(
    ("setting", "value"),
    _cases(_numeric(NODE_SETTINGS), NON_FINITE) + _cases(_names(NODE_SETTINGS), UNSAFE_NAMES),
)
def test_a_fleet_node_key_refuses_a_bad_value_naming_its_key(
    tmp_path: Path, setting: Setting, value: object
) -> None:
    """Read as a fleet file is, before anything starts."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(tomli_w.dumps({"node": [{**NODE_BASE, setting.key: value}]}))
    with pytest.raises(SettingsError) as err:
        load_fleet(str(fleet))
    _names_the_key(err.value, setting.key)


def test_the_base_entry_and_the_defaults_are_accepted(tmp_path: Path) -> None:
    """What the cases change is the only thing wrong in them."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(tomli_w.dumps({"node": [NODE_BASE]}))
    assert [n.name for n in load_fleet(str(fleet))] == ["a"]
    assert RunSettings.from_config(run_defaults()).round_timeout_s > 0
