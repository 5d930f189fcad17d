"""fl_client.contract: the cap from every door, the TRAIN config, the TRAIN report, and
record rows that are standard JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pytest

from fl_client.contract import (
    RECORD_VERSION,
    Cap,
    NodeDescriptor,
    NodeRow,
    RoundRow,
    SettingsError,
    TrainConfig,
    TrainReport,
    format_schedule,
    key_of,
    parse_batch_sizes,
    to_record,
)
from fl_client.settings import load_fleet, node_settings, parse_p_max_schedule
from fl_client.settings_table import NODE

# --------------------------------------------------------------------------- Cap


@pytest.mark.parametrize("value", ["none", "None", " NONE ", "", None, "inf", math.inf, Cap.NONE])
def test_no_cap_from_every_door_is_one_value(value: object) -> None:
    cap = Cap.parse(value)
    assert cap == Cap.NONE and not cap.capped and math.isinf(cap.watts)
    assert cap.label == "none" and cap.setting == "none" and str(cap) == "none"
    assert cap.to_wire() == math.inf and cap.to_record() is None
    assert cap.with_margin(0.05).limit_w == math.inf


@pytest.mark.parametrize("value", [4.5, "4.5", " 4.5 ", 4.5e0, np.float64(4.5), Cap(4.5)])
def test_a_cap_from_every_door_is_one_value(value: object) -> None:
    cap = Cap.parse(value)
    assert cap == Cap(4.5) and cap.capped and cap.watts == 4.5
    assert cap.label == "4.5 W" and cap.setting == "4.5" and str(cap) == "4.5 W"
    assert cap.to_wire() == 4.5 and cap.to_record() == 4.5
    assert cap.with_margin(0.0).limit_w == 4.5
    assert cap.with_margin(0.05).limit_w == pytest.approx(4.275)


def test_integral_caps_label_without_a_decimal_point() -> None:
    assert Cap.parse(7).label == "7 W" and Cap.parse("10").setting == "10"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "must be > 0 W"),
        (-3, "must be > 0 W"),
        ("-inf", "must be > 0 W"),
        ("nan", "must be > 0 W"),
        (math.nan, "must be > 0 W"),
        ("abc", "expected a number of watts > 0 or 'none'"),
        (True, "expected a number of watts > 0 or 'none'"),
        ([5], "expected a number of watts > 0 or 'none'"),
    ],
)
def test_bad_caps_are_refused_naming_the_key(value: object, message: str) -> None:
    with pytest.raises(SettingsError, match=message) as err:
        Cap.parse(value)
    assert str(err.value).startswith("p-max-w: ")
    with pytest.raises(SettingsError, match=r"^node-config: p-max-w: "):
        Cap.parse(value, key="node-config: p-max-w")


def test_a_cap_cannot_be_built_broken_and_sorts_no_cap_last() -> None:
    with pytest.raises(SettingsError, match="p-max-w"):
        Cap(0.0)
    with pytest.raises(SettingsError, match="p-max-w"):
        Cap(math.nan)
    assert sorted([Cap.NONE, Cap(7.0), Cap(4.5)]) == [Cap(4.5), Cap(7.0), Cap.NONE]


@pytest.mark.parametrize("margin", [-0.1, 1.0, 1.5])
def test_the_cap_with_its_margin_refuses_a_margin_outside_0_1(margin: float) -> None:
    with pytest.raises(SettingsError, match=r"cap-margin: must be a number in \[0, 1\)"):
        Cap(5.0).with_margin(margin)


def test_settings_schedules_and_fleets_parse_caps_through_cap(tmp_path: Any) -> None:
    """The other doors (settings, schedules, fleet files, node_config) give the same Cap."""
    assert NODE["p-max-w"].parse("none") == Cap.NONE and NODE["p-max-w"].parse("4.5") == Cap(4.5)
    steps = parse_p_max_schedule("1:7, 3:4.5, 5:none, 7:inf", "n")
    assert steps == ((1, Cap(7.0)), (3, Cap(4.5)), (5, Cap.NONE), (7, Cap.NONE))
    assert format_schedule(steps) == "1:7,3:4.5,5:none,7:none"
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[[node]]\nname = "a"\ndevice = "jetson-nano"\np-max-w = 4.5\n'
        '[[node]]\nname = "b"\ndevice = "jetson-nano"\np-max-w = "none"\n'
        '[[node]]\nname = "c"\ndevice = "jetson-nano"\n'
    )
    assert [n.p_max for n in load_fleet(fleet)] == [Cap(4.5), Cap.NONE, Cap.NONE]
    node, _, _ = node_settings({"device": "jetson-nano", "p-max-w": "4.5"}, None)
    assert node.p_max == Cap(4.5)


# --------------------------------------------------------------------------- TrainConfig


def _train_config(**over: Any) -> TrainConfig:
    fields: dict[str, Any] = {
        "server_round": 3,
        "method": "power-aware",
        "model": "cnn",
        "batch_sizes": (8, 16, 32),
        "r": (0.4, 0.7, 1.0),
        "lr_ref": 0.003,
        "b_ref": 128,
        "local_epochs": 2,
    }
    return TrainConfig(**{**fields, **over})


REQUIRED_TRAIN_KEYS = (
    "server-round",
    "method",
    "model",
    "batch-sizes",
    "r",
    "lr-ref",
    "b-ref",
    "local-epochs",
)


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"deadline_s": 12.5, "time_calibration": 1.25},
        {"method": "fixed", "fixed_batch_size": 16, "fixed_freq_mhz": 460.8},
        {"method": "oracle", "initial_weights_sha256": "0123456789abcdef" * 4},
    ],
)
def test_train_config_round_trips_through_its_config_record(over: dict[str, Any]) -> None:
    cfg = _train_config(**over)
    record = cfg.to_config()
    assert all("_" not in key for key in record)  # kebab-case
    assert all(value is not None for value in record.values())  # None fields left out
    assert isinstance(record["batch-sizes"], list) and isinstance(record["r"], list)
    json.dumps(record, allow_nan=False)  # what a ConfigRecord can carry
    assert TrainConfig.from_config(record) == cfg


def test_train_config_optional_keys_may_be_absent() -> None:
    record = {k: v for k, v in _train_config().to_config().items() if k in REQUIRED_TRAIN_KEYS}
    cfg = TrainConfig.from_config(record)
    assert cfg.deadline_s is None and cfg.time_calibration == 1.0
    assert cfg.fixed_batch_size is None and cfg.fixed_freq_mhz is None
    assert cfg.batch_sizes == (8, 16, 32) and cfg.r == (0.4, 0.7, 1.0)
    assert cfg.initial_weights_sha256 is None  # the run starts from random weights


@pytest.mark.parametrize("sha", ["abc", "A" * 64, "g" * 64, "a" * 65])
def test_a_malformed_checkpoint_sha256_in_the_train_config_is_refused(sha: str) -> None:
    record = {**_train_config().to_config(), "initial-weights-sha256": sha}
    with pytest.raises(SettingsError, match=r"^initial-weights-sha256: expected 64 hex digits"):
        TrainConfig.from_config(record)


@pytest.mark.parametrize("key", REQUIRED_TRAIN_KEYS)
def test_train_config_missing_key_is_named(key: str) -> None:
    record = _train_config().to_config()
    del record[key]
    with pytest.raises(SettingsError, match=rf"^{key}: missing from the TRAIN config"):
        TrainConfig.from_config(record)


@pytest.mark.parametrize("keys", [["energy-j"], ["p-max-w", "cap-margin"]])
def test_train_config_unknown_keys_are_refused(keys: list[str]) -> None:
    record = {**_train_config().to_config(), **dict.fromkeys(keys, 1.0)}
    with pytest.raises(SettingsError, match=rf"^{', '.join(sorted(keys))}: not part of the"):
        TrainConfig.from_config(record)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"method": "fastest"}, "method: unknown value 'fastest'"),
        ({"method": "fixed"}, "method: 'fixed' needs fixed-batch-size and fixed-freq-mhz"),
        ({"r": [0.5, 1.0]}, "r: has 2 values but batch-sizes has 3"),
        ({"r": [0.5, 1.0, 1.5]}, r"r: every value must be in \(0, 1\]"),
        ({"r": "0.5,0.7,1"}, "r: malformed value"),
        ({"batch-sizes": [16, 8, 32]}, "batch-sizes: must be strictly ascending"),
        ({"batch-sizes": 5}, "batch-sizes: expected a comma-separated list"),
        ({"lr-ref": 0}, "lr-ref: must be a finite number > 0"),
        ({"lr-ref": "fast"}, "lr-ref: expected a number > 0"),
        ({"server-round": "x"}, "server-round: malformed value 'x'"),
        ({"b-ref": None}, "b-ref: malformed value None"),
        ({"local-epochs": "two"}, "local-epochs: malformed value"),
        ({"deadline-s": 0}, "deadline-s: must be a finite number > 0"),
        ({"deadline-s": "soon"}, "deadline-s: malformed value"),
        ({"time-calibration": "z"}, "time-calibration: malformed value"),
        ({"fixed-batch-size": "w"}, "fixed-batch-size: malformed value"),
    ],
)
def test_train_config_malformed_values_name_the_key(over: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        TrainConfig.from_config({**_train_config().to_config(), **over})


@pytest.mark.parametrize("calibration", [0.0, -1.0, math.inf, math.nan])
def test_a_meaningless_time_calibration_counts_as_none(calibration: float) -> None:
    assert _train_config(time_calibration=calibration).time_calibration == 1.0


# --------------------------------------------------------------------------- TrainReport


def _report(**over: Any) -> TrainReport:
    fields: dict[str, Any] = {
        "num_examples": 100.0,
        "train_time_s": 12.0,
        "train_energy_j": 48.0,
        "avg_power_w": 4.0,
        "peak_power_w": 4.4,
        "idle_power_w": 1.2,
        "p_max_w": 5.0,
        "cap_margin": 0.05,
        "batch_size": 32.0,
        "gpu_freq_mhz": 460.8,
        "profile_time_s": 3.0,
        "profile_energy_j": 9.0,
        "cap_violations": 0.0,
        "time_over_cap_s": 0.0,
        "train_loss": 0.5,
    }
    return TrainReport(**{**fields, **over})


def test_train_report_keys_are_its_fields_and_energy_is_split() -> None:
    keys = TrainReport.required_keys()
    assert keys == tuple(key_of(f.name) for f in dataclasses.fields(TrainReport))[: len(keys)]
    assert "train-energy-j" in keys and "profile-energy-j" in keys and "energy-j" not in keys
    assert "deadline-s" not in keys and "drift-deviation" not in keys  # optional
    # sent: the required keys, and the optional ones that have a value (a default or given)
    with_default = {
        key_of(f.name) for f in dataclasses.fields(TrainReport) if f.default is not None
    }
    assert "lut-from-cache" in with_default and "deadline-s" not in with_default
    assert set(_report().to_metrics()) == with_default
    assert set(_report(deadline_s=9.0).to_metrics()) == with_default | {"deadline-s"}


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"p_max_w": math.inf, "idle_power_w": math.nan},
        {"deadline_s": 9.0, "slack_s": -1.0, "deadline_miss": 1.0, "fastest_time_s": 8.0},
        {"drift_deviation": 0.3, "drift_reprofiled": 1.0, "drift_batch_size": 16.0},
    ],
)
def test_train_report_round_trips_through_its_metric_record(over: dict[str, Any]) -> None:
    report = _report(**over)
    metrics = report.to_metrics()
    assert all(isinstance(v, float) for v in metrics.values())
    assert all(key_of(k) == k for k in metrics)
    back = TrainReport.from_metrics(metrics)
    # NaN != NaN: compare the standard-JSON forms, where NaN is null
    assert back.to_record() == report.to_record()
    assert back.cap == Cap.parse(over.get("p_max_w", 5.0))
    for key, value in over.items():
        got = getattr(back, key)
        assert got == value or (math.isnan(got) and math.isnan(value)), key


def test_train_report_missing_or_unknown_metrics_are_named() -> None:
    metrics = _report().to_metrics()
    del metrics["train-energy-j"], metrics["peak-power-w"]
    with pytest.raises(ValueError, match=r"reply lacks metrics: train-energy-j, peak-power-w"):
        TrainReport.from_metrics(metrics)
    old = {**_report().to_metrics(), "energy-j": 48.0}  # the old key, now two
    with pytest.raises(ValueError, match=r"reply has unknown metrics: energy-j"):
        TrainReport.from_metrics(old)


def test_train_report_record_is_standard_json() -> None:
    record = _report(p_max_w=math.inf, idle_power_w=math.nan).to_record()
    assert record["p-max-w"] is None and record["idle-power-w"] is None
    assert record["train-energy-j"] == 48.0
    json.dumps(record, allow_nan=False)


# --------------------------------------------------------------------------- descriptor


def _descriptor(**over: Any) -> NodeDescriptor:
    fields: dict[str, Any] = {
        "node_name": "nano-1",
        "partition_id": 2,
        "device": "jetson-nano",
        "backend": "simulated",
        "p_max": Cap(5.0),
        "p_max_schedule": "",
        "gpu_freqs_mhz": (76.8, 153.6),
        "memory_bytes": 4 << 30,
        "power_rail": "POM_5V_IN",
        "max_batch_size": 64,
    }
    return NodeDescriptor(**{**fields, **over})


@pytest.mark.parametrize(
    "over", [{}, {"p_max": Cap.NONE}, {"p_max": Cap(7.0), "p_max_schedule": "1:7,3:4.5,5:none"}]
)
def test_node_descriptor_round_trips_and_records_no_cap_as_null(over: dict[str, Any]) -> None:
    desc = _descriptor(**over)
    config = desc.to_config()
    assert config["p-max-w"] == desc.p_max.to_wire()
    assert NodeDescriptor.from_config(config) == desc
    record = desc.to_record()
    assert record["p-max-w"] == desc.p_max.to_record()
    json.dumps(record, allow_nan=False)


def test_a_power_limit_descriptor_sends_its_values_in_watts() -> None:
    """A node whose knob is the GPU power limit sends its grid as gpu-power-limits-w with
    knob, never as gpu-freqs-mhz; the frequency path sends neither key, as before."""
    desc = _descriptor(gpu_freqs_mhz=(200.0, 450.0, 700.0), knob="power-limit")
    config = desc.to_config()
    assert config["gpu-power-limits-w"] == [200.0, 450.0, 700.0] and config["knob"] == "power-limit"
    assert "gpu-freqs-mhz" not in config
    assert NodeDescriptor.from_config(config) == desc
    plain = _descriptor().to_config()
    assert "knob" not in plain and "gpu-power-limits-w" not in plain
    with pytest.raises(ValueError, match="knob: unknown value 'volts'; allowed: frequency, power"):
        NodeDescriptor.from_config({**config, "knob": "volts"})
    with pytest.raises(ValueError, match="gpu-power-limits-w"):
        NodeDescriptor.from_config({**plain, "knob": "power-limit"})


def test_node_descriptor_cap_follows_its_schedule() -> None:
    desc = _descriptor(p_max=Cap(7.0), p_max_schedule="1:7,3:4.5,5:none")
    assert [desc.cap_at(r) for r in (1, 2, 3, 4, 5, 9)] == [
        Cap(7.0),
        Cap(7.0),
        Cap(4.5),
        Cap(4.5),
        Cap.NONE,
        Cap.NONE,
    ]
    assert _descriptor().cap_at(9) == Cap(5.0)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max-batch-size", None, "max-batch-size: missing from the QUERY reply"),
        ("memory-bytes", "lots", "memory-bytes: malformed value 'lots'"),
        ("gpu-freqs-mhz", "76.8", "gpu-freqs-mhz: malformed value"),
        ("p-max-w", -1, "p-max-w: must be > 0 W"),
        # names that become file names on the server (its LUT library)
        ("node-name", "../../escaped", r"QUERY reply: node-name: '\.\./\.\./escaped' cannot be"),
        ("device", "../../escaped", r"QUERY reply: device: '\.\./\.\./escaped' cannot be"),
        ("device", "/etc/x", "QUERY reply: device: '/etc/x' cannot be used as a name"),
        ("backend", "sim/../..", "QUERY reply: backend: 'sim/../..' cannot be used as a name"),
        ("node-name", "", "QUERY reply: node-name: '' cannot be used as a name"),
        ("device", None, "device: missing from the QUERY reply"),
    ],
)
def test_node_descriptor_bad_replies_name_the_key(key: str, value: Any, message: str) -> None:
    config = _descriptor().to_config()
    if value is None:
        del config[key]
    else:
        config[key] = value
    with pytest.raises(SettingsError, match=message):
        NodeDescriptor.from_config(config)


# --------------------------------------------------------------------------- rows


def test_node_rows_are_kebab_case_standard_json_with_the_real_cap() -> None:
    ok = NodeRow(2, 11, "nano-1", "jetson-nano", Cap.NONE, True, _report(p_max_w=math.inf))
    rec = ok.to_record()
    assert rec["server-round"] == 2 and rec["node-name"] == "nano-1" and rec["ok"] is True
    assert rec["p-max-w"] is None and rec["train-energy-j"] == 48.0
    failed = NodeRow(2, 12, "nano-2", "jetson-nano", Cap(4.5), False, error="boom")
    rec = failed.to_record()
    assert rec["p-max-w"] == 4.5 and rec["error"] == "boom" and "train-time-s" not in rec
    for row in (ok, failed):
        json.dumps(row.to_record(), allow_nan=False)
        assert all("_" not in key for key in row.to_record())


def test_round_rows_are_kebab_case_standard_json() -> None:
    row = RoundRow(
        server_round=1,
        accuracy=0.5,
        loss=math.nan,
        round_time_s=3.0,
        sim_time_s=3.0,
        round_energy_j=11.0,
        fleet_energy_j=11.0,
        round_busy_energy_j=10.0,
        fleet_busy_energy_j=10.0,
        round_idle_energy_j=1.0,
        fleet_idle_energy_j=1.0,
        nodes_ok=2,
        nodes_failed=1,
        failed=["c: boom"],
    )
    rec = row.to_record()
    assert rec["server-round"] == 1 and rec["nodes-ok"] == 2 and rec["failed"] == ["c: boom"]
    assert rec["deadline-s"] is None and rec["loss"] is None
    assert all("_" not in key for key in rec)
    assert rec["round-idle-energy-j"] == 1.0 and rec["critical-node"] is None
    json.dumps(rec, allow_nan=False)
    assert RECORD_VERSION == 4


def test_to_record_leaves_no_inf_or_nan_anywhere() -> None:
    value = {
        "a": math.inf,
        "b": [math.nan, 1.0, (2.0, -math.inf)],
        "c": {"cap": Cap.NONE, "capped": Cap(4.5), 3: np.float64("nan")},
        "d": np.array([1.0, np.inf]),
        "e": "inf",
        "f": None,
    }
    rec = to_record(value)
    assert rec == {
        "a": None,
        "b": [None, 1.0, [2.0, None]],
        "c": {"cap": None, "capped": 4.5, "3": None},
        "d": [1.0, None],
        "e": "inf",
        "f": None,
    }
    text = json.dumps(rec, allow_nan=False)
    assert "Infinity" not in text and "NaN" not in text


def test_parse_batch_sizes_names_the_key() -> None:
    assert parse_batch_sizes("4, 8,16") == [4, 8, 16] and parse_batch_sizes([4, 8]) == [4, 8]
    with pytest.raises(SettingsError, match="batch-sizes: must not be empty"):
        parse_batch_sizes("")
    with pytest.raises(SettingsError, match="batch-sizes: batch sizes must be positive"):
        parse_batch_sizes([0, 4])
    with pytest.raises(SettingsError, match="b: must be strictly ascending"):
        parse_batch_sizes([8, 8], key="b")
