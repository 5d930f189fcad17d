"""Unknown keys everywhere they can be typed, and settings, fleet files and deprecated names
that are checked without PyTorch."""

from __future__ import annotations

from pathlib import Path

import pytest

from fl_client.devices.descriptors import DeviceSpecError, load_device_spec
from fl_client.settings import (
    MODEL_NAMES,
    REPO_ROOT,
    RunSettings,
    SettingsError,
    check_partitioner_keys,
    load_fleet,
    node_settings,
    translate_deprecated,
)
from fl_client.settings_table import device_options
from tests.fl_client.test_preflight import NANO, ORIN, _check, _fleet

# ----------------------------------------------------------------- unknown keys (§1)


def test_unknown_keys_are_refused_everywhere_with_the_nearest_key(tmp_path: Path) -> None:
    """Run settings, fleet entries, node_config, device options and device descriptors:
    one rule, one wording."""
    with pytest.raises(SettingsError, match=r"run settings: unknown key 'cap-margn' \(did you"):
        RunSettings.from_config({"cap-margn": 0.5})
    fleet = _fleet(tmp_path, 'name = "n"\ndevice = "jetson-nano"\np-max_w = 4.5', ORIN)
    with pytest.raises(SettingsError, match=r"\(n\): unknown key 'p-max_w' \(did you mean p-max-w"):
        load_fleet(fleet)
    with pytest.raises(SettingsError, match=r"node-config \(x\): unknown key 'cap-windw-s'"):
        node_settings({"name": "x", "device": "jetson-nano", "cap-windw-s": 1}, None)
    with pytest.raises(SettingsError, match=r"device options: unknown key 'sample-rate'"):
        device_options({"sample-rate": 10})
    folder = tmp_path / "devices"
    folder.mkdir()
    text = (REPO_ROOT / "configs" / "devices" / "jetson-nano.toml").read_text()
    (folder / "jetson-nano.toml").write_text(text.replace("[power]", "[power]\nidle-watts = 1"))
    with pytest.raises(DeviceSpecError, match=r"power\.idle-watts: unknown key.*did you mean"):
        load_device_spec("jetson-nano", folder)


# ---------------------------------------------------------------- no PyTorch to check


def test_model_names_match_the_models_task_builds() -> None:
    from fl_client import model_zoo

    assert MODEL_NAMES == model_zoo.MODEL_NAMES


# ----------------------------------------------------------------------- the round plan


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("straggler_work", 0, r"straggler-work: expected a number in \(0, 1\]"),
        ("straggler_work", 1.5, r"straggler-work: expected a number in \(0, 1\]"),
        ("straggler_work", "half", r"straggler-work: expected a number in \(0, 1\]"),
        ("balance", "fastest", "balance: unknown value 'fastest'; allowed: off, samples, steps"),
        ("round_deadline_s", -1.0, r"round-deadline-s: expected a finite number ≥ 0"),
        ("critical_r_weight", -0.1, r"critical-r-weight: expected a number in \[0, 1\]"),
        ("critical_r_weight", 1.5, r"critical-r-weight: expected a number in \[0, 1\]"),
        ("critical_r_weight", True, r"critical-r-weight: expected a number in \[0, 1\]"),
    ],
)
def test_bad_round_plan_settings_are_refused_naming_the_key(
    tmp_path: Path, key: str, value: object, allowed: str
) -> None:
    with pytest.raises(SettingsError, match=allowed):
        _check(tmp_path, _fleet(tmp_path, NANO, ORIN), **{key: value})


def test_round_plan_settings_default_to_todays_rule(tmp_path: Path) -> None:
    s = RunSettings.from_config({})
    assert (s.balance, s.straggler_work, s.round_deadline_s) == ("off", 1.0, 0.0)
    _check(tmp_path, _fleet(tmp_path, NANO, ORIN), balance="samples", straggler_work=0.5)


def test_deadline_pacing_settings_run_as_the_round_plans_energy_mode() -> None:
    """``pacing = "deadline"`` was deadline pacing; ``balance = "energy"`` replaced it. An old
    config runs as the new one, and each old key comes with a note saying what to write."""
    old = {"pacing": "deadline", "pacing-margin": 0.1, "pacing-deadline-s": 3.0}
    s = RunSettings.from_config(old)
    assert (s.balance, s.deadline_margin, s.round_deadline_s) == ("energy", 0.1, 3.0)
    _, notes = translate_deprecated(old)
    assert notes == [
        'pacing = "deadline": deprecated; it runs as balance = "energy" (write that instead)',
        "pacing-margin: deprecated; it runs as deadline-margin = 0.1 (write that instead)",
        "pacing-deadline-s: deprecated; it runs as round-deadline-s = 3.0 (write that instead)",
    ]
    assert RunSettings.from_config({"pacing": "off"}).balance == "off"
    # with the app defaults merged in (as Flower merges them), a new key at its default
    # takes the old key's value
    merged = RunSettings.from_config({"pacing-margin": 0.2, "deadline-margin": 0.05})
    assert merged.deadline_margin == 0.2


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"pacing": "fast"}, "pacing: unknown value 'fast'; pacing is deprecated: write balance"),
        (
            {"pacing": "deadline", "balance": "steps"},
            'pacing: "deadline" is balance = "energy" now, which conflicts with balance',
        ),
        (
            {"pacing-margin": 0.1, "deadline-margin": 0.2},
            "pacing-margin: the deprecated name of deadline-margin, and both are set",
        ),
        (
            {"pacing-deadline-s": 2.0, "round-deadline-s": 3.0},
            "pacing-deadline-s: the deprecated name of round-deadline-s, and both are set",
        ),
    ],
)
def test_deprecated_pacing_settings_that_contradict_the_new_ones_are_refused(
    config: dict[str, object], message: str
) -> None:
    with pytest.raises(SettingsError) as err:
        RunSettings.from_config(config)
    assert message in str(err.value)


# ------------------------------------------------------- the shape of every file given


ORIN6 = 'name = "orin-6w"\ndevice = "jetson-orin-nano"\np-max-w = 6.0'


def _fleet_file(tmp_path: Path, text: str, name: str = "fleet.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _nodes(*entries: str) -> str:
    return "\n".join(f"[[node]]\n{e}\n" for e in entries)


# ------------------------------------------------------------------------ the fleet file


def test_a_fleet_of_strings_names_the_file_and_the_form(tmp_path: Path) -> None:
    fleet = _fleet_file(tmp_path, 'node = ["a", "b"]\n', "strings.toml")
    with pytest.raises(SettingsError) as err:
        load_fleet(fleet)
    msg = str(err.value)
    assert msg.startswith("fleet strings.toml node #1: node: expected a [[node]] table")
    assert "got str 'a'" in msg and "not node = [...]" in msg


def test_a_fleet_with_an_unknown_table_or_none_at_all_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"unknown key 'nodes' \(did you mean node\?\)"):
        load_fleet(_fleet_file(tmp_path, "[[nodes]]\n" + NANO + "\n", "typo.toml"))
    with pytest.raises(SettingsError, match=r"has no \[\[node\]\] tables; a fleet file has one"):
        load_fleet(_fleet_file(tmp_path, "", "empty.toml"))


def test_an_empty_cap_is_refused_not_run_uncapped(tmp_path: Path) -> None:
    fleet = _fleet_file(tmp_path, _nodes('name = "n"\ndevice = "jetson-nano"\np-max-w = ""'))
    with pytest.raises(SettingsError) as err:
        load_fleet(fleet)
    assert "(n): p-max-w: empty; give a number of watts > 0 (e.g. 5.0), or 'none'" in str(err.value)
    assert load_fleet(_fleet_file(tmp_path, _nodes(NANO), "ok.toml"))[0].p_max.watts == 5.0


def test_a_schedule_csv_with_an_empty_cap_is_refused(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text("round,p-max-w\n1,7\n2,\n")
    fleet = _fleet_file(
        tmp_path, _nodes('name = "s"\ndevice = "jetson-nano"\np-max-schedule = "trace.csv"')
    )
    with pytest.raises(SettingsError, match=r"\(s\): p-max-schedule: round 2 has no cap"):
        load_fleet(fleet)


def test_a_fleet_path_that_is_a_folder_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="is a folder, not a fleet file"):
        load_fleet(tmp_path)


# -------------------------------------------------------------------- typed run settings


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("fixed-batch-size", "abc", "fixed-batch-size: expected a batch size ≥ 1 (0: not set)"),
        ("fixed-batch-size", 3.5, "fixed-batch-size: expected a batch size ≥ 1"),
        ("fixed-freq-mhz", "fast", "fixed-freq-mhz: expected a GPU frequency in MHz > 0"),
        ("fixed-freq-mhz", -5, "fixed-freq-mhz: expected a GPU frequency in MHz > 0"),
    ],
)
def test_fixed_settings_of_the_wrong_type_name_the_key(
    key: str, value: object, needle: str
) -> None:
    with pytest.raises(SettingsError) as err:
        RunSettings.from_config(
            {"method": "fixed", "fixed-batch-size": 8, "fixed-freq-mhz": 460.8, key: value}
        )
    assert needle in str(err.value)


def test_a_partitioners_setting_for_another_partitioner_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"classes-per-node: only partitioning = 'patholog"):
        check_partitioner_keys({"classes-per-node": 3})  # the default is dirichlet
    with pytest.raises(SettingsError, match=r"dirichlet-alpha: .* partitioning is 'iid'"):
        check_partitioner_keys({"partitioning": "iid", "dirichlet-alpha": 0.1})
    check_partitioner_keys({"partitioning": "pathological", "classes-per-node": 3})
    check_partitioner_keys({"dirichlet-alpha": 0.1})
