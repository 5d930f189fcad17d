"""Cap schedules: the ``p-max-schedule`` setting (inline steps or a CSV trace), the cap of
each round, and a scheduled node profiling each cap once (upfront or lazily)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fl_client.contract import Cap
from fl_client.lut import LUT
from fl_client.node import describe_node, train_node
from fl_client.settings import (
    RunSettings,
    SettingsError,
    load_fleet,
    node_settings,
    parse_p_max_schedule,
)
from tests.fl_client.test_node import (
    NODE,
    R_FOR_B64,
    initial_state,
    run_config,
    train_config,
)


def test_schedule_parses_steps_and_csv(tmp_path: Path) -> None:
    assert parse_p_max_schedule("1:7.0, 5:4.5 ,9:none", "n") == (
        (1, Cap(7.0)),
        (5, Cap(4.5)),
        (9, Cap.NONE),
    )
    csv = tmp_path / "trace.csv"
    csv.write_text("round,p-max-w\n1,7\n2,6.5\n3,none\n")
    assert parse_p_max_schedule(str(csv), "n") == ((1, Cap(7.0)), (2, Cap(6.5)), (3, Cap.NONE))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("2:7.0,5:4.5", "must start at round 1"),
        ("1:7.0,5:-4.5", r"p-max-schedule \(round 5\): must be > 0 W"),
        ("1:7.0,5:lots", r"p-max-schedule \(round 5\): expected a number"),
        ("1:7.0,x:4.5", "round 'x' is not an integer"),
        ("1:7.0,5:4.5,5:4.0", "strictly ascending"),
        ("1-7.0", "is not 'round:cap'"),
        ("", "expected a string"),
        ("missing.csv", "schedule file not found"),
    ],
)
def test_bad_schedules_name_node_and_key(value: str, match: str) -> None:
    with pytest.raises(SettingsError, match=match) as err:
        parse_p_max_schedule(value, "fleet f.toml node #2 (nano)")
    assert "fleet f.toml node #2 (nano): p-max-schedule" in str(err.value)


def test_csv_trace_with_gaps_or_a_wrong_header_is_refused(tmp_path: Path) -> None:
    csv = tmp_path / "trace.csv"
    csv.write_text("round,p-max-w\n1,7\n2,6.5\n5,4.5\n")
    with pytest.raises(SettingsError, match=r"gaps: rounds \[3, 4\] are missing"):
        parse_p_max_schedule(str(csv), "node-config")
    csv.write_text("round,cap\n1,7\n")
    with pytest.raises(SettingsError, match="must start with the header 'round,p-max-w'"):
        parse_p_max_schedule(str(csv), "node-config")


def test_fleet_schedule_and_both_keys(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        '[[node]]\nname = "solar"\ndevice = "jetson-nano"\np-max-schedule = "1:7,3:4.5"\n'
        "count = 2\n"
    )
    nodes = load_fleet(fleet)
    assert [nodes[0].p_max_at(r) for r in (1, 2, 3, 9)] == [Cap(7.0), Cap(7.0), Cap(4.5), Cap(4.5)]
    assert nodes[0].p_max == Cap(7.0)  # the first step
    assert nodes[1].scheduled_caps == (Cap(4.5), Cap(7.0))
    assert "p-max-schedule" not in nodes[1].options
    fleet.write_text(
        '[[node]]\nname = "solar"\ndevice = "jetson-nano"\np-max-w = 5\np-max-schedule = "1:7"\n'
    )
    with pytest.raises(SettingsError, match=r"\(solar\): p-max-w and p-max-schedule"):
        load_fleet(fleet)


def test_scheduled_caps_ascend_with_no_cap_last_and_a_fixed_cap_is_one() -> None:
    node, _, _ = node_settings(
        {"device": "jetson-nano", "p-max-schedule": "1:none,2:7,3:4.5"}, None
    )
    assert node.scheduled_caps == (Cap(4.5), Cap(7.0), Cap.NONE)
    assert [node.p_max_at(r) for r in (1, 2, 3)] == [Cap.NONE, Cap(7.0), Cap(4.5)]
    fixed, _, _ = node_settings({"device": "jetson-nano", "p-max-w": 5}, None)
    assert fixed.scheduled_caps == (Cap(5.0),) and fixed.p_max_at(99) == Cap(5.0)


def test_the_server_knows_each_rounds_cap_from_the_query_reply(tmp_path: Path) -> None:
    """The strategy names a failed node's cap from its descriptor: it must be the node's own."""
    csv = tmp_path / "trace.csv"
    csv.write_text("round,p-max-w\n1,7\n2,none\n3,4.5\n4,4.5\n5,6\n")
    query = {"model": "cnn", "batch-sizes": [8, 16]}
    for schedule in ("1:7,3:4.5,5:none", str(csv)):
        node_config = {**NODE, "p-max-schedule": schedule}
        node, _, _ = node_settings(node_config, None)
        desc = describe_node(run_config(tmp_path), node_config, query)
        assert [desc.cap_at(r) for r in range(1, 9)] == [node.p_max_at(r) for r in range(1, 9)]


def test_schedule_profiling_rejects_unknown_values() -> None:
    with pytest.raises(SettingsError, match="schedule-profiling"):
        RunSettings.from_config({"schedule-profiling": "sometimes"})
    assert RunSettings.from_config({}).schedule_profiling == "upfront"
    assert RunSettings.from_config({"schedule-profiling": "lazy"}).schedule_profiling == "lazy"


# --------------------------------------------------------------------------- on the node


def _cached_caps(luts: Path) -> list[tuple[float | None, float]]:
    """(bare cap, cap margin) of every LUT cached under ``luts``, no cap last."""
    caps = [
        (lut.limit.cap_w, lut.limit.cap_margin) for lut in map(LUT.load, luts.rglob("lut_*.json"))
    ]
    return sorted(caps, key=lambda c: (c[0] is None, c[0] or 0.0))


def test_cap_schedule_profiles_each_cap_when_it_first_applies_and_skips_infeasible_rounds(
    tmp_path: Path,
) -> None:
    run = run_config(tmp_path, **{"schedule-profiling": "lazy"})
    node = {**NODE, "p-max-schedule": "1:7.0,2:4.5,3:1.0,4:none,5:7.0,6:1.0"}
    state = initial_state()
    luts = tmp_path / "cache" / "nodes"

    _, m1 = train_node(run, node, train_config(1, r=R_FOR_B64), state)
    assert m1.cap == Cap(7.0) and m1.peak_power_w < 7.0 and m1.profile_time_s > 0
    assert _cached_caps(luts) == [(7.0, 0.05)]  # only round 1's cap so far, and its margin
    _, m2 = train_node(run, node, train_config(2, r=R_FOR_B64), state)
    assert m2.cap == Cap(4.5) and m2.peak_power_w < 4.5
    assert m2.profile_time_s > 0  # 4.5 W applies for the first time
    assert m1.batch_size == m2.batch_size == 64  # R_FOR_B64
    assert m2.gpu_freq_mhz < m1.gpu_freq_mhz  # the tighter cap moves it down
    with pytest.raises(RuntimeError, match=r"no configuration fits round 3.s cap of 1 W") as e3:
        train_node(run, node, train_config(3, r=R_FOR_B64), state)
    assert "profiling for this cap took" in str(e3.value)
    _, m4 = train_node(run, node, train_config(4, r=R_FOR_B64), state)
    assert m4.cap == Cap.NONE and m4.profile_time_s > 0
    # 7 W, 4.5 W and 1 W, each with the node's margin, and no cap (no margin)
    assert _cached_caps(luts) == [(1.0, 0.05), (4.5, 0.05), (7.0, 0.05), (None, 0.0)]
    # caps seen before come from the cache: no profiling, the same choice, the same skip
    _, m5 = train_node(run, node, train_config(5, r=R_FOR_B64), state)
    assert m5.profile_time_s == 0.0 and m5.lut_from_cache == 1.0
    assert (m5.batch_size, m5.gpu_freq_mhz) == (m1.batch_size, m1.gpu_freq_mhz)
    with pytest.raises(RuntimeError, match=r"no configuration fits round 6's") as e6:
        train_node(run, node, train_config(6, r=R_FOR_B64), state)
    assert "profiling for this cap took" not in str(e6.value)


def test_cap_schedule_upfront_profiles_every_cap_in_round_1_then_nothing(tmp_path: Path) -> None:
    run = run_config(tmp_path)  # schedule-profiling = "upfront", the default
    node = {**NODE, "p-max-schedule": "1:7.0,2:4.5,3:1.0,4:none"}
    state = initial_state()
    luts = tmp_path / "cache" / "nodes"
    _, m1 = train_node(run, node, train_config(1), state)
    assert _cached_caps(luts) == [(1.0, 0.05), (4.5, 0.05), (7.0, 0.05), (None, 0.0)]
    assert m1.lut_from_cache == 0.0
    lazy_run = run_config(tmp_path / "lazy", **{"schedule-profiling": "lazy"})
    _, lazy1 = train_node(lazy_run, node, train_config(1), state)
    assert m1.profile_time_s > lazy1.profile_time_s > 0  # it paid for all four caps
    assert (m1.batch_size, m1.gpu_freq_mhz) == (lazy1.batch_size, lazy1.gpu_freq_mhz)
    _, m2 = train_node(run, node, train_config(2), state)
    assert m2.cap == Cap(4.5) and m2.profile_time_s == 0.0 and m2.lut_from_cache == 1.0
    with pytest.raises(RuntimeError, match=r"no configuration fits round 3.s") as e3:
        train_node(run, node, train_config(3), state)
    assert "profiling for this cap took" not in str(e3.value)
    _, m4 = train_node(run, node, train_config(4), state)
    assert m4.cap == Cap.NONE and m4.profile_time_s == 0.0
