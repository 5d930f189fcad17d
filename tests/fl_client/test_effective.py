"""Settings that cannot take effect in a run: refused when typed for it, named in one
warning line when a shared config carries them (``fl_client.effective``)."""

from __future__ import annotations

from typing import Any

import pytest

from fl_client.balance import BALANCE_MODES
from fl_client.effective import BALANCE_KEYS, check_effective, idle_settings, unread_keys
from fl_client.settings import RunSettings, SettingsError

#: Each balance key away from its default.
OFF_DEFAULT: dict[str, Any] = {
    "straggler-work": 0.5,
    "round-deadline-s": 60.0,
    "critical-r-weight": 0.5,
    "deadline-margin": 0.2,
}


def runs(cfg: dict[str, Any], methods: list[str]) -> list[RunSettings]:
    """One command's runs: ``cfg`` resolved for each of ``methods``, as ``powerfl simulate``
    resolves them (``fixed`` with its batch size and clock)."""
    fixed = {"fixed-batch-size": 16, "fixed-freq-mhz": 921.6}
    return [
        RunSettings.from_config({**cfg, "method": m, **(fixed if m == "fixed" else {})})
        for m in methods
    ]


def test_every_balance_key_has_an_off_default_value_here() -> None:
    assert set(OFF_DEFAULT) == set(BALANCE_KEYS)


@pytest.mark.parametrize(("key", "value"), OFF_DEFAULT.items())
def test_a_balance_key_typed_with_balance_off_is_refused(key: str, value: Any) -> None:
    with pytest.raises(SettingsError) as err:
        check_effective(runs({key: value, "balance": "off"}, ["power-aware"]), typed=[key])
    text = str(err.value)
    assert text.startswith(f"{key}: {value!r} would take no effect")
    assert 'balance = "off" plans no round' in text and f"leave {key} out" in text


@pytest.mark.parametrize(("key", "value"), OFF_DEFAULT.items())
def test_a_balance_key_carried_by_the_config_is_named_in_one_line(key: str, value: Any) -> None:
    line = check_effective(runs({key: value}, ["power-aware", "b1"]), typed=["num-rounds"])
    assert line is not None and "\n" not in line
    assert f"{key} = {value!r}" in line and 'balance = "off"' in line


def test_the_deprecated_name_of_a_key_counts_as_typed() -> None:
    with pytest.raises(SettingsError, match=r"deadline-margin: 0\.2 would take no effect"):
        check_effective(runs({"pacing-margin": 0.2}, ["power-aware"]), typed=["pacing-margin"])


def test_defaults_and_a_balance_that_runs_say_nothing() -> None:
    assert check_effective(runs({}, ["power-aware", "b1"])) is None
    planned = {"balance": "steps", **OFF_DEFAULT}
    assert idle_settings(runs(planned, ["power-aware"])) == []
    assert check_effective(runs(planned, ["oracle"]), typed=[*OFF_DEFAULT, "balance"]) is None


@pytest.mark.parametrize("methods", [["b1"], ["b1", "b2", "fixed"]])
def test_balance_typed_for_methods_that_plan_no_round_is_refused(methods: list[str]) -> None:
    with pytest.raises(SettingsError) as err:
        check_effective(runs({"balance": "steps"}, methods), typed=["balance"])
    text = str(err.value)
    assert text.startswith("balance: 'steps' would take no effect")
    assert f"this run's methods are {', '.join(methods)}" in text
    assert "add power-aware to --methods" in text


def test_a_balance_key_typed_beside_balance_for_b1_is_refused_too() -> None:
    cfg = {"balance": "energy", "round-deadline-s": 60.0}
    with pytest.raises(SettingsError, match=r"round-deadline-s: 60\.0 would take no effect"):
        check_effective(runs(cfg, ["b1"]), typed=["round-deadline-s"])


def test_balance_in_a_comparison_where_some_methods_plan_is_named_for_the_others() -> None:
    line = check_effective(
        runs({"balance": "steps"}, ["power-aware", "b1", "b2"]), typed=["balance"]
    )
    assert line is not None
    assert 'balance = "steps": b1, b2 plans no round and runs without it' in line


def test_a_tracking_uri_without_tracking_is_refused_typed_and_named_carried() -> None:
    settings = runs({"tracking-uri": "http://host:5000"}, ["power-aware"])
    with pytest.raises(SettingsError) as err:
        check_effective(settings, typed=["tracking-uri"])
    assert str(err.value).startswith("tracking-uri: 'http://host:5000' would take no effect")
    assert 'set tracking = "mlflow"' in str(err.value)
    line = check_effective(settings, typed=["num-rounds"])
    assert line is not None and 'tracking-uri = "http://host:5000"' in line
    tracked = {"tracking": "mlflow", "tracking-uri": "http://host:5000"}
    assert idle_settings(runs(tracked, ["b1"])) == []


def test_a_key_only_another_balance_mode_reads_is_refused_naming_its_mode() -> None:
    settings = runs({"balance": "energy", "max-work-share": 2.0}, ["power-aware"])
    with pytest.raises(SettingsError) as err:
        check_effective(settings, typed=["balance", "max-work-share"])
    text = str(err.value)
    assert text.startswith("max-work-share: 2.0 would take no effect")
    assert 'only balance = "steps" reads it' in text and 'balance = "energy"' in text
    steps = runs({"balance": "steps", "max-work-share": 2.0}, ["power-aware"])
    assert check_effective(steps, typed=["balance", "max-work-share"]) is None
    off = runs({"max-work-share": 2.0}, ["power-aware"])
    with pytest.raises(SettingsError, match='balance = "off" plans no round'):
        check_effective(off, typed=["max-work-share"])


# ------------------------------------------------------------------------------ fedbuff


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("buffer-size", 2),
        ("staleness-weight", "inverse"),
        ("while-waiting", "idle"),
        ("update-budget", "fleet"),
    ],
)
def test_a_fedbuff_key_typed_without_fedbuff_is_refused(key: str, value: Any) -> None:
    settings = runs({key: value, "aggregation": "fedavg"}, ["power-aware"])
    with pytest.raises(SettingsError) as err:
        check_effective(settings, typed=[key])
    text = str(err.value)
    assert text.startswith(f"{key}: {value!r} would take no effect")
    assert 'only aggregation = "fedbuff" reads it, and this run has aggregation = "fedavg"' in text
    carried = check_effective(settings, typed=[])
    assert carried is not None and f"{key} = " in carried
    # aggregation = "auto" (the default): B1 runs synchronous FedAvg, and reads none of them
    with pytest.raises(SettingsError, match=f'{key}: .* aggregation = "fedavg"'):
        check_effective(runs({key: value}, ["b1", "b2"]), typed=[key])


def test_a_fedbuff_key_typed_for_a_comparison_is_read_by_its_fedbuff_run() -> None:
    """The default comparison, power-aware (``auto``: fedbuff) and B1 (``auto``: fedavg):
    the power-aware run reads the buffer's settings, so typing one is not refused."""
    compared = runs({"buffer-size": 2}, ["power-aware", "b1"])
    assert [r.aggregation for r in compared] == ["fedbuff", "fedavg"]
    assert check_effective(compared, typed=["buffer-size"]) is None


def test_fedbuff_with_its_keys_says_nothing_and_refuses_a_fraction_of_the_fleet() -> None:
    cfg = {"aggregation": "fedbuff", "buffer-size": 2, "staleness-weight": "constant"}
    assert check_effective(runs(cfg, ["power-aware"]), typed=cfg) is None
    settings = runs({**cfg, "fraction-train": 0.5}, ["power-aware"])
    with pytest.raises(SettingsError, match=r"fraction-train: 0\.5 would take no effect.*busy"):
        check_effective(settings, typed=["fraction-train"])
    # with B1 beside it (auto: synchronous rounds), B1's rounds sample the fleet
    compared = runs({"fraction-train": 0.5}, ["power-aware", "b1"])
    assert check_effective(compared, typed=["fraction-train"]) is None


@pytest.mark.parametrize(
    ("cfg", "aggregation"),
    [
        ({}, "fedbuff"),
        ({"method": "oracle"}, "fedbuff"),
        ({"method": "b1"}, "fedavg"),
        ({"method": "b2"}, "fedavg"),
        ({"method": "fixed", "fixed-batch-size": 16, "fixed-freq-mhz": 921.6}, "fedavg"),
        ({"balance": "steps"}, "fedavg"),
        ({"method": "oracle", "balance": "energy"}, "fedavg"),
        ({"aggregation": "fedavg"}, "fedavg"),
        ({"method": "b1", "aggregation": "fedbuff"}, "fedbuff"),
        ({"balance": "steps", "aggregation": "fednova"}, "fednova"),
    ],
)
def test_auto_aggregation_resolves_per_method_and_a_typed_one_stands(
    cfg: dict[str, Any], aggregation: str
) -> None:
    assert RunSettings.from_config({"aggregation": "auto", **cfg}).aggregation == aggregation


def test_unread_keys_are_what_a_run_of_a_method_does_not_read() -> None:
    sync = RunSettings.from_config({"aggregation": "fedavg"})
    assert {"buffer-size", "buffer-step", "while-waiting", "straggler-work"} <= unread_keys(
        sync, "power-aware"
    )
    assert "balance" not in unread_keys(sync, "power-aware")
    assert "balance" in unread_keys(sync, "b1")  # B1 plans no round
    fedbuff = RunSettings.from_config({})  # auto: power-aware with balance off runs fedbuff
    assert not {"buffer-size", "buffer-step", "while-waiting"} & unread_keys(fedbuff, "b1")
    steps = RunSettings.from_config({"balance": "steps"})
    assert not set(BALANCE_MODES["steps"].reads) & unread_keys(steps, "power-aware")
    assert set(BALANCE_MODES["steps"].reads) <= unread_keys(steps, "b1")
    assert "tracking-uri" in unread_keys(sync, "power-aware")
