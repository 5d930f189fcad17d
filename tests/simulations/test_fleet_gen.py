"""The seeded fleet generator: deterministic, within its ranges, and its fleets load."""

from __future__ import annotations

import math
import re

import pytest

from fl_client.devices.descriptors import DEVICE_KINDS, load_device_spec
from fl_client.settings import load_fleet, tomllib
from simulations.cli import main
from simulations.experiments.fleet_gen import (
    CAP_STEP_W,
    MAX_BOARDS,
    MAX_NODES,
    MIN_NODES,
    cap_range_w,
    fleet_toml,
    generate_fleet,
    write_fleet,
)

SEEDS = range(40)
SAFE_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def test_the_same_seed_gives_the_same_fleet_and_file():
    for seed in (0, 7, 123):
        assert generate_fleet(seed) == generate_fleet(seed)
        assert fleet_toml(generate_fleet(seed)) == fleet_toml(generate_fleet(seed))


def test_different_seeds_give_different_fleets():
    fleets = {fleet_toml(generate_fleet(s)) for s in SEEDS}
    assert len(fleets) == len(SEEDS)


def test_cap_ranges_run_from_the_lowest_band_to_the_highest_power_mode():
    for kind in DEVICE_KINDS:
        spec = load_device_spec(kind)
        low, high = cap_range_w(kind)
        assert low == spec.b1_freq_caps[0].min_p_max_w
        assert high == max(w for _, w in spec.nvpmodel_budgets_w)
        assert low < high
    assert cap_range_w("jetson-nano") == (4.5, 10.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_fleet_is_within_its_ranges(seed):
    fleet = generate_fleet(seed)
    assert MIN_NODES <= fleet.num_nodes <= MAX_NODES
    names = [e.name for e in fleet.entries]
    assert len(set(names)) == len(names)
    for e in fleet.entries:
        assert e.device in DEVICE_KINDS
        assert 1 <= e.count <= MAX_BOARDS
        assert SAFE_NAME.match(e.name), e.name
        if not math.isinf(e.p_max_w):
            low, high = cap_range_w(e.device)
            assert low <= e.p_max_w <= high
            assert (e.p_max_w / CAP_STEP_W) == pytest.approx(round(e.p_max_w / CAP_STEP_W))


def test_the_draws_cover_kinds_sizes_caps_between_modes_and_no_cap():
    entries = [e for s in SEEDS for e in generate_fleet(s).entries]
    assert {e.device for e in entries} == set(DEVICE_KINDS)
    assert any(math.isinf(e.p_max_w) for e in entries)
    published = {w for k in DEVICE_KINDS for _, w in load_device_spec(k).nvpmodel_budgets_w}
    assert any(not math.isinf(e.p_max_w) and e.p_max_w not in published for e in entries)
    sizes = {generate_fleet(s).num_nodes for s in SEEDS}
    assert min(sizes) < 9 and max(sizes) > 13  # the size range is used, not one value
    assert {e.count for e in entries} == set(range(1, MAX_BOARDS + 1))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_written_fleet_loads_through_the_fleet_loader(tmp_path, seed):
    fleet = generate_fleet(seed)
    path = write_fleet(seed, tmp_path / "sub" / f"fleet-{seed}.toml")
    nodes = load_fleet(str(path))
    assert len(nodes) == fleet.num_nodes
    expected = [(e.device, e.p_max_w) for e in fleet.entries for _ in range(e.count)]
    loaded = [(n.device, n.p_max.watts if n.p_max.capped else math.inf) for n in nodes]
    assert loaded == expected
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert set(data) == {"node"}
    for table, e in zip(data["node"], fleet.entries, strict=True):
        assert table["name"] == e.name and table["device"] == e.device
        assert table["p-max-w"] == ("none" if math.isinf(e.p_max_w) else e.p_max_w)
        assert table.get("count", 1) == e.count


def test_the_command_writes_the_fleet_file(tmp_path, capsys):
    out = tmp_path / "f.toml"
    assert main(["experiment", "fleet", "--seed", "5", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == fleet_toml(generate_fleet(5))
    assert main(["experiment", "fleet", "--seed", "5"]) == 0
    assert capsys.readouterr().out.endswith(fleet_toml(generate_fleet(5)))
    assert main(["experiment", "fleet", "--seed", "-1"]) == 2
    assert "--seed: must be ≥ 0" in capsys.readouterr().err
