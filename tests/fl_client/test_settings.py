"""Run and node settings: defaults, overrides, and errors that name the key."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from fl_client.settings import (
    FLEET_PATH_KEYS,
    Cap,
    RunSettings,
    SettingsError,
    load_fleet,
    node_entry_keys,
    node_settings,
    parse_batch_sizes,
)
from fl_client.settings_table import device_options


def test_defaults_come_from_pyproject() -> None:
    s = RunSettings.from_config({})
    assert s.method == "power-aware"
    assert s.batch_sizes == [4, 8, 16, 32, 64, 128]
    assert s.fleet == "default"  # a shipped fleet's name
    assert s.dataset == "digits"
    assert (s.r_eval_every_samples, s.r_max_samples) == (256, 40_000)
    assert not hasattr(s, "extra")


def test_every_field_is_a_declared_key_with_one_default() -> None:
    keys = RunSettings.keys()
    assert keys == tuple(f.name.replace("_", "-") for f in dataclasses.fields(RunSettings))
    assert {"dataset", "r-eval-every-samples", "r-max-samples"} <= set(keys)
    assert "extra" not in keys


def test_r_estimation_knobs_are_run_settings() -> None:
    s = RunSettings.from_config({"r-eval-every-samples": 128, "r-max-samples": "12288"})
    assert (s.r_eval_every_samples, s.r_max_samples) == (128, 12_288)
    with pytest.raises(SettingsError, match="r-eval-every-samples: expected an integer ≥ 1"):
        RunSettings.from_config({"r-eval-every-samples": 0})
    with pytest.raises(SettingsError, match="r-max-samples: expected an integer ≥ 1"):
        RunSettings.from_config({"r-max-samples": 1.5})
    with pytest.raises(SettingsError, match="dataset: must be a dataset name"):
        RunSettings.from_config({"dataset": " "})


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("cap-margn", "(did you mean cap-margin?)"),
        ("num_rounds", "(did you mean num-rounds?)"),
        ("r-max-sample", "(did you mean r-max-samples?)"),
        ("zzz", "; known keys: aggregation, allow-untrained-nodes, b-ref, balance, batch-sizes,"),
    ],
)
def test_unknown_run_settings_are_refused_with_a_hint(key: str, hint: str) -> None:
    with pytest.raises(SettingsError) as err:
        RunSettings.from_config({key: 1})
    assert str(err.value).startswith(f"run settings: unknown key {key!r}")
    assert hint in str(err.value)


def test_overrides_win() -> None:
    s = RunSettings.from_config({"method": "b1", "batch-sizes": "8,16", "num-rounds": 3})
    assert (s.method, s.batch_sizes, s.num_rounds) == ("b1", [8, 16], 3)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"method": "fastest"}, "method: unknown value 'fastest'; allowed: power-aware, b1"),
        ({"model": "vgg"}, "model: unknown value 'vgg'; allowed: cnn, resnet18, mobilenetv2"),
        ({"batch-sizes": ""}, "batch-sizes: must not be empty"),
        ({"batch-sizes": "32,16"}, "batch-sizes: must be strictly ascending"),
        ({"batch-sizes": "8,x"}, "batch-sizes: expected integers"),
        ({"num-rounds": 0}, "num-rounds: expected an integer ≥ 1"),
        ({"target-accuracy": 1.5}, "target-accuracy: must be in"),
        ({"lr-ref": "fast"}, "lr-ref: expected a number"),
        ({"partitioning": "shards"}, "partitioning: unknown value 'shards'"),
        ({"method": "fixed"}, "method: 'fixed' needs fixed-batch-size and fixed-freq-mhz"),
        ({"cap-margin": 1.0}, "cap-margin: expected a number in [0, 1), got 1.0"),
        ({"cap-margin": -0.05}, "cap-margin: expected a number in [0, 1), got -0.05"),
        ({"cap-margin": "lots"}, "cap-margin: expected a number in [0, 1), got 'lots'"),
        ({"buffer-size": 0}, "buffer-size: expected an integer ≥ 1, got 0"),
        ({"staleness-weight": "sqrt"}, "staleness-weight: unknown value 'sqrt'; allowed: "),
        ({"while-waiting": "sleep"}, "while-waiting: unknown value 'sleep'; allowed: train, idle"),
        (
            {"aggregation": "fedbuff", "balance": "steps"},
            "balance: 'steps' plans synchronous rounds, and aggregation = \"fedbuff\" has none",
        ),
    ],
)
def test_bad_run_settings_name_the_key(override: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        RunSettings.from_config(override)


@pytest.mark.parametrize("value", [0, -3, "nan", "abc", True, float("nan")])
def test_bad_caps(value: object) -> None:
    with pytest.raises(SettingsError, match="p-max-w"):
        Cap.parse(value)


@pytest.mark.parametrize("value", ["none", None, "", float("inf")])
def test_no_cap(value: object) -> None:
    assert math.isinf(Cap.parse(value).watts)
    assert Cap.parse(value) == Cap.NONE


def test_batch_sizes_list_form() -> None:
    assert parse_batch_sizes([4, 8]) == [4, 8]


def test_default_fleet_is_heterogeneous() -> None:
    fleet = load_fleet("default")  # a shipped fleet, by name
    assert len(fleet) >= 8
    assert len({n.device for n in fleet}) >= 3
    caps = [n.p_max for n in fleet]
    assert all(isinstance(c, Cap) for c in caps)
    assert Cap.NONE in caps and min(caps).watts <= 5.0


def test_fleet_errors(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="fleet: fleet file not found"):
        load_fleet(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text('[[node]]\nname = "x"\ndevice = "jetson-nano-9000"\n')
    with pytest.raises(SettingsError, match="device: unknown device kind 'jetson-nano-9000'"):
        load_fleet(bad)
    bad.write_text('[[node]]\ndevice = "jetson-nano"\np-max-w = -1\n')
    with pytest.raises(SettingsError, match="node #1: p-max-w: must be > 0 W"):
        load_fleet(bad)
    bad.write_text(
        '[[node]]\nname = "a"\ndevice = "jetson-nano"\ncount = 2\n'
        '[[node]]\nname = "a-1"\ndevice = "jetson-nano"\n'
    )
    with pytest.raises(SettingsError, match="node names must be unique, repeated: a-1"):
        load_fleet(bad)
    bad.write_text("this is not toml [")
    with pytest.raises(SettingsError, match="is not valid TOML"):
        load_fleet(bad)
    bad.write_text('title = "no nodes"\n')
    with pytest.raises(SettingsError, match=r"unknown key 'title'; known keys: node"):
        load_fleet(bad)
    bad.write_text("# no nodes\n")
    with pytest.raises(SettingsError, match=r"has no \[\[node\]\] tables"):
        load_fleet(bad)
    bad.write_text('[[node]]\ndevice = "jetson-nano"\ncount = 0\n')
    with pytest.raises(SettingsError, match="count: expected an integer ≥ 1"):
        load_fleet(bad)
    bad.write_text('[[node]]\nname = "n"\ndevice = "jetson-nano"\nknob = "power-limit"\n')
    with pytest.raises(SettingsError, match=r"node #1 \(n\): knob: power-limit needs .* the "
                       "simulated backend sets the GPU frequency"):  # fmt: skip
        load_fleet(bad)
    bad.write_text('[[node]]\nname = "n"\ndevice = "jetson-nano"\nknob = "volts"\n')
    with pytest.raises(SettingsError, match=r"knob: unknown value 'volts'; allowed: frequency, "
                       "power-limit, auto"):  # fmt: skip
        load_fleet(bad)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("p-max = 5\n", r"node #1 \(n\): unknown key 'p-max' \(did you mean p-max-w\?\)"),
        ("cap-margn = 0.1\n", r"unknown key 'cap-margn' \(did you mean cap-margin\?\)"),
        ("sample-rate = 40\n", r"unknown key 'sample-rate' \(did you mean sample-rate-hz\?\)"),
        ("colour = 1\n", "unknown key 'colour'; known keys: "),
    ],
)
def test_fleet_entries_refuse_unknown_keys(tmp_path: Path, entry: str, message: str) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[node]]\nname = "n"\ndevice = "jetson-nano"\n' + entry)
    with pytest.raises(SettingsError, match=message):
        load_fleet(fleet)
    with pytest.raises(SettingsError, match="node-config"):
        node_settings({"device": "jetson-nano", entry.split(" = ")[0]: 1}, None)


def test_fleet_entries_take_node_backend_and_flower_keys(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[[node]]\nname = "n"\ndevice = "jetson-nano"\nbackend = "simulated"\n'
        'p-max-w = "none"\ncap-margin = 0.1\ncount = 2\ncap-window-s = 2.0\n'
        "twin-slowdown = 1.5\n"
    )
    nodes = load_fleet(fleet)
    assert [n.name for n in nodes] == ["n-1", "n-2"] and nodes[0].p_max == Cap.NONE
    assert nodes[0].options == {"cap-window-s": 2.0, "twin-slowdown": 1.5}
    node, pid, num = node_settings(
        {"device": "jetson-nano", "partition-id": 1, "num-partitions": 3, "name": "x"}, None
    )
    assert (node.name, pid, num) == ("x", 1, 3)


def test_node_settings_from_node_config_or_fleet() -> None:
    node, pid, num = node_settings(
        {
            "device": "jetson-nano",
            "backend": "simulated",
            "p-max-w": 5.0,
            "partition-id": 2,
            "num-partitions": 4,
        },
        None,
    )
    assert (node.device, node.p_max, pid, num) == ("jetson-nano", Cap(5.0), 2, 4)
    fleet = load_fleet("default")  # a shipped fleet, by name
    node, pid, _ = node_settings({"partition-id": 1, "num-partitions": len(fleet)}, fleet)
    assert node == fleet[1] and pid == 1
    with pytest.raises(SettingsError, match="partition-id: 99 has no node"):
        node_settings({"partition-id": 99}, fleet)
    with pytest.raises(SettingsError, match="no 'device' key and no fleet file"):
        node_settings({"partition-id": 0}, None)


def test_backend_options_in_fleet_and_node_config_reach_the_device_options(
    tmp_path: Path,
) -> None:

    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[[node]]\nname = "n"\ndevice = "jetson-nano"\np-max-w = 5\ncount = 2\n'
        "cap-window-s = 2.5\nsample-rate-hz = 40\n"
    )
    nodes = load_fleet(fleet)
    assert [n.name for n in nodes] == ["n-1", "n-2"]
    for n in nodes:
        assert n.options == {"cap-window-s": 2.5, "sample-rate-hz": 40}
        opts = device_options(n.options)
        assert (opts.cap_window_s, opts.sample_rate_hz) == (2.5, 40)
    node, _, _ = node_settings(
        {"device": "jetson-nano", "backend": "jetson", "sysfs-root": "/tmp/x", "p-max-w": 7},
        None,
    )
    assert node.options == {"sysfs-root": "/tmp/x"}
    assert device_options(node.options).sysfs_root == "/tmp/x"


REPLAY_EXAMPLE = Path(__file__).resolve().parents[2] / (
    "configs/replay/example-illustrative-jetson-nano-resnet18.csv"
)


def test_relative_paths_in_a_fleet_file_are_relative_to_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CSV schedule and a replay table next to the fleet file are found from any current
    directory; absolute paths and inline schedules stay as they are."""
    from fl_client.devices import open_device
    from fl_client.devices.replay import ReplayDevice

    folder = tmp_path / "configs" / "fleets"
    (folder / "traces").mkdir(parents=True)
    (folder / "traces" / "solar.csv").write_text("round,p-max-w\n1,7\n2,4.5\n3,none\n")
    (folder / "tables").mkdir()
    (folder / "tables" / "nano.csv").write_text(REPLAY_EXAMPLE.read_text())
    fleet = folder / "fleet.toml"
    fleet.write_text(
        '[[node]]\nname = "solar"\ndevice = "jetson-nano"\np-max-schedule = "traces/solar.csv"\n'
        '[[node]]\nname = "replayed"\ndevice = "jetson-nano"\nbackend = "replay"\n'
        'replay-table = "tables/nano.csv"\np-max-w = 5\n'
        '[[node]]\nname = "absolute"\ndevice = "jetson-nano"\nbackend = "replay"\n'
        f"replay-table = {json.dumps(str(REPLAY_EXAMPLE))}\n"
        '[[node]]\nname = "inline"\ndevice = "jetson-nano"\np-max-schedule = "1:7,3:4.5"\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    solar, replayed, absolute, inline = load_fleet(fleet)
    assert solar.p_max_schedule == ((1, Cap(7.0)), (2, Cap(4.5)), (3, Cap.NONE))
    assert replayed.options["replay-table"] == str(folder / "tables" / "nano.csv")
    assert absolute.options["replay-table"] == str(REPLAY_EXAMPLE)
    assert inline.p_max_schedule == ((1, Cap(7.0)), (3, Cap(4.5)))
    assert set(FLEET_PATH_KEYS) <= set(node_entry_keys())  # every path key is an entry key
    for node in (replayed, absolute):
        options = device_options(node.options)
        device = open_device(node.device, node.backend, options=options)
        assert isinstance(device, ReplayDevice) and device.knob_values
    # --node-config is no file: its paths are left as typed.
    node, _, _ = node_settings(
        {"device": "jetson-nano", "backend": "replay", "replay-table": "tables/nano.csv"}, None
    )
    assert node.options["replay-table"] == "tables/nano.csv"


def test_a_missing_file_of_a_fleet_file_is_named_at_its_resolved_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fl_client.devices import open_device
    from fl_client.devices.replay import ReplayFormatError

    folder = tmp_path / "fleets"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)
    scheduled = folder / "scheduled.toml"
    scheduled.write_text(
        '[[node]]\nname = "solar"\ndevice = "jetson-nano"\np-max-schedule = "traces/gone.csv"\n'
    )
    missing = folder / "traces" / "gone.csv"
    with pytest.raises(SettingsError, match=re.escape(f"schedule file not found: {missing}")):
        load_fleet(scheduled)
    replayed = folder / "replayed.toml"
    replayed.write_text(
        '[[node]]\nname = "ghost"\ndevice = "jetson-nano"\nbackend = "replay"\n'
        'replay-table = "gone.json"\n'
    )
    (node,) = load_fleet(replayed)
    options = device_options(node.options)
    missing = folder / "gone.json"
    with pytest.raises(ReplayFormatError, match=re.escape(f"file not found: {missing}")):
        open_device(node.device, node.backend, options=options)


def test_cap_margin_default_and_per_node_override(tmp_path: Path) -> None:
    assert RunSettings.from_config({}).cap_margin == 0.05
    assert RunSettings.from_config({"cap-margin": 0}).cap_margin == 0.0
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[[node]]\nname = "tight"\ndevice = "jetson-nano"\np-max-w = 4.5\n'
        "cap-margin = 0.1\ncount = 2\n"
        '[[node]]\nname = "plain"\ndevice = "jetson-nano"\np-max-w = 7\n'
    )
    nodes = load_fleet(fleet)
    assert [n.cap_margin for n in nodes] == [0.1, 0.1, None]
    assert "cap-margin" not in nodes[0].options  # a node setting, not a backend option
    node, _, _ = node_settings({"device": "jetson-nano", "cap-margin": "0.02"}, None)
    assert node.cap_margin == 0.02
    fleet.write_text('[[node]]\nname = "bad"\ndevice = "jetson-nano"\ncap-margin = 1.5\n')
    with pytest.raises(SettingsError, match=r"node #1 \(bad\): cap-margin: expected a number"):
        load_fleet(fleet)


def test_every_run_setting_is_declared_in_the_apps_pyproject():
    """`flwr run --run-config` can only set keys the app declares in
    [tool.flwr.app.config]: every run setting must be there, with a default that parses."""
    from fl_client.settings import RunSettings, app_defaults

    declared = app_defaults()
    assert sorted(set(RunSettings.keys()) - set(declared)) == []
    assert sorted(set(declared) - set(RunSettings.keys())) == []
    RunSettings.from_config(declared)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        # names that become paths: the node's cache folder, LUT files, the server's library
        (
            'name = "../../escaped"\ndevice = "jetson-nano"\n',
            r"node #1: name: '\.\./\.\./escaped' cannot be used as a name",
        ),
        ('name = "a/b"\ndevice = "jetson-nano"\n', "name: 'a/b' cannot be used as a name"),
        ('name = ""\ndevice = "jetson-nano"\n', "name: '' cannot be used as a name"),
        ('name = ".."\ndevice = "jetson-nano"\n', "name: '..' cannot be used as a name"),
        (
            'name = "n"\ndevice = "../board"\nbackend = "replay"\n',
            r"device: '\.\./board' cannot be used as a name",
        ),
        # Flower's keys: a fleet file cannot set them (node i is partition i)
        (
            'name = "n"\ndevice = "jetson-nano"\npartition-id = nan\n',
            "partition-id: a fleet file cannot set it",
        ),
        (
            'name = "n"\ndevice = "jetson-nano"\nnum-partitions = -3\n',
            "num-partitions: a fleet file cannot set it",
        ),
        # device options with no finite value, named before any engine starts
        (
            'name = "n"\ndevice = "jetson-nano"\ncap-window-s = inf\n',
            r"\(n\): cap-window-s: expected a finite number > 0, got inf",
        ),
        (
            'name = "n"\ndevice = "jetson-nano"\nsample-rate-hz = inf\n',
            "sample-rate-hz: expected a finite number > 0",
        ),
        (
            'name = "n"\ndevice = "jetson-nano"\nsample-rate-hz = nan\n',
            "sample-rate-hz: expected a finite number > 0",
        ),
        (
            'name = "n"\ndevice = "jetson-nano"\npower-limit-step-w = -5\n',
            "power-limit-step-w: expected a finite number > 0",
        ),
        (
            'name = "n"\ndevice = "jetson-nano"\ntwin-drift-from-round = inf\n',
            "twin-drift-from-round: expected an integer ≥ 1",
        ),
    ],
)
def test_fleet_entries_refuse_unsafe_names_flower_keys_and_infinite_options(
    tmp_path: Path, entry: str, message: str
) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("[[node]]\n" + entry)
    with pytest.raises(SettingsError, match=message):
        load_fleet(fleet)


@pytest.mark.parametrize(
    ("node_config", "message"),
    [
        ({"name": "../../escaped"}, r"node-config: name: '\.\./\.\./escaped' cannot be"),
        ({"partition-id": math.nan}, "partition-id: expected an integer ≥ 0, got nan"),
        ({"partition-id": math.inf}, "partition-id: expected an integer ≥ 0, got inf"),
        ({"partition-id": -1}, "partition-id: expected an integer ≥ 0, got -1"),
        ({"num-partitions": -3}, "num-partitions: expected an integer ≥ 1, got -3"),
        ({"cap-window-s": math.inf}, "node-config .*cap-window-s: expected a finite number > 0"),
    ],
)
def test_node_config_refuses_unsafe_names_and_bad_partitions(
    node_config: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        node_settings({"device": "jetson-nano", **node_config}, None)


@pytest.mark.parametrize("window", [0, -2, 2.5, "three", True])
def test_a_bad_target_window_is_refused_naming_the_key(window: object) -> None:
    with pytest.raises(SettingsError, match=r"^target-window: .*an integer ≥ 1"):
        RunSettings.from_config({"target-window": window})


def test_the_target_window_defaults_to_three_rounds_and_takes_any_whole_number() -> None:
    assert RunSettings.from_config({}).target_window == 3
    assert RunSettings.from_config({"target-window": 1}).target_window == 1
    # longer than the round budget: allowed, the server names it at start (window_note)
    assert RunSettings.from_config({"target-window": 30, "num-rounds": 5}).target_window == 30
