"""Choosing the default from the robustness study: issue 32's four criteria per arm, the
proposal (the fastest that meets all, else the safest), issue 33's goals for a ``fedbuff``
arm, and a provisional verdict on an incomplete study."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from fl_server.target import first_round_at
from simulations.experiments import robustness
from simulations.experiments import robustness_verdict as rv
from simulations.experiments.registry import load_config
from simulations.experiments.report_kit import Doc
from simulations.experiments.robustness_report import CRITERION_TITLES, Reach
from tests.fl_server.test_async_loop import _lines
from tests.fl_server.test_async_loop import _run as run_fedbuff_fake
from tests.simulations.test_robustness import _rec, _study_folder, _write

B1_S, B1_J = 10.0, 100.0
#: 20 pairs: 4 fleets × 5 seeds
KEYS = [(f"f{i // 5}", i % 5) for i in range(20)]
#: the two pairs where `off` and `late2` are later than B1 (late2 no later than off)
LATE = {KEYS[3], KEYS[11]}


def _reach(time_s: float | None, energy_j: float = 50.0) -> dict[str, Reach]:
    """The same outcome under both criteria; ``time_s`` None: missed (to the run's end)."""
    r = Reach(None, 30.0, 300.0, 0.1) if time_s is None else Reach(5, time_s, energy_j, 0.1)
    return {"first": r, "smoothed": r}


def _arm_runs(key: tuple[str, int]) -> dict[str, dict[str, Reach]]:
    late = key in LATE
    return {
        "b1": _reach(B1_S, B1_J),
        "off": _reach(12.0 if late else 8.0, 70.0),  # 0.8×: fails (b)'s median
        "good2": _reach(5.0, 60.0),  # meets all, 0.5×
        "good": _reach(4.0, 60.0),  # meets all, 0.4×: the fastest
        "misser": _reach(None if key == KEYS[0] else 4.0, 60.0),  # misses B1's target once
        "late2": _reach(11.0 if late else 4.0, 60.0),  # later than B1 in 2 of 20: 90%
        "slow07": _reach(7.0, 60.0),  # median 0.7×: 1.43× sooner
        "async3": _reach(3.0, 50.0),
        "async8": _reach(3.0, 50.0),
    }


SYNC = ["off", "good2", "good", "misser", "late2", "slow07"]
ASYNC = ["async3", "async8"]
CONFIG: dict[str, Any] = {
    "fleets": ["f0", "f1"],
    "generated-fleets": [1, 2],
    "seeds": 5,
    "arms": [
        {"name": "b1", "method": "b1"},
        *({"name": a, "method": "power-aware"} for a in SYNC),
        *({"name": a, "method": "power-aware", "aggregation": "fedbuff"} for a in ASYNC),
    ],
}


def _async_records(arms: list[str]) -> list[dict[str, Any]]:
    """The records the verdict reads of the fedbuff arms: settings and idle share."""
    share = {"async3": 0.03, "async8": 0.08}
    return [
        {
            "uses": [[k[0], a]],
            "settings": {"aggregation": "fedbuff"},
            "summary": {"idle-share": share[a]},
        }
        for k in KEYS
        for a in arms
        if a in share
    ]


def _choice(drop: tuple[str, ...] = (), pairs: Any = None) -> dict[str, Any]:
    pairs = pairs or {k: _arm_runs(k) for k in KEYS}
    config = {**CONFIG, "arms": [a for a in CONFIG["arms"] if a["name"] not in drop]}
    pairs = {k: {a: r for a, r in runs.items() if a not in drop} for k, runs in pairs.items()}
    return rv.choose_default(pairs, _async_records(ASYNC), config)


def _judged(v: dict[str, Any], arm: str, kind: str = "arms") -> dict[str, Any]:
    return next(j for j in v[kind] if j["arm"] == arm)


def test_each_arm_passes_or_fails_the_criteria_it_should_with_its_denominators():
    v = _choice()["criteria"]["smoothed"]
    assert {j["arm"]: j["fails"] for j in v["arms"]} == {
        "off": ["b-share", "b-median"],
        "good2": [],
        "good": [],
        "misser": ["a"],
        "late2": ["b-share"],
        "slow07": ["b-median"],
        "async3": [],
        "async8": [],
    }
    checks = {c["check"]: c for c in _judged(v, "late2")["checks"]}
    assert checks["b-share"]["measured"] == "18/20 pairs no later than B1 = 90.0%"
    assert checks["b-share"]["value"] == pytest.approx(0.9)
    assert checks["b-median"]["measured"] == "0.40× = 2.50× sooner"
    # the pair where B1 reaches the target and misser does not: a miss, and later than B1
    checks = {c["check"]: c for c in _judged(v, "misser")["checks"]}
    assert checks["a"]["measured"] == "1 missed of 20 pairs where B1 reaches it"
    assert checks["b-share"]["measured"] == "19/20 pairs no later than B1 = 95.0%"
    assert checks["b-share"]["pass"] and checks["c"]["value"] == pytest.approx(0.95)
    slow = {c["check"]: c for c in _judged(v, "slow07")["checks"]}["b-median"]
    assert slow["value"] == pytest.approx(0.7) and slow["measured"] == "0.70× = 1.43× sooner"


def test_the_proposal_is_the_fastest_arm_that_meets_all_four_asynchronous_or_not():
    v = _choice()["criteria"]["smoothed"]
    # async8 fails issue 33's idle goal, not issue 32's four criteria
    assert v["meets-all"] == ["good2", "good", "async3", "async8"]
    assert (v["proposed"], v["proposed-as"], v["fails"]) == ("async3", "fastest", [])
    assert v["proposed-is-async"] and v["synchronous"] == "good"
    text = rv.proposal_text(v)
    assert 'Proposed default: `async3` (asynchronous: aggregation = "fedbuff")' in text
    assert "3.33× sooner; the 2× aim met" in text
    assert "The synchronous default it is compared with: `good`." in text
    v = _choice(drop=tuple(ASYNC))["criteria"]["smoothed"]  # the synchronous arms alone
    assert (v["proposed"], v["synchronous"], v["proposed-is-async"]) == ("good", "good", False)
    assert "Proposed default: `good`, the fastest" in rv.proposal_text(v)
    assert "2.50× sooner; the 2× aim met" in rv.proposal_text(v)


def test_when_no_arm_meets_all_four_the_safest_is_kept_with_what_it_fails():
    v = _choice(drop=("good", "good2", *ASYNC))["criteria"]["smoothed"]
    assert v["meets-all"] == []
    # misser is fastest but misses a target B1 reaches; off, late2 and slow07 are never
    # later than off; late2 has the lowest median
    assert (v["proposed"], v["proposed-as"], v["fails"]) == ("late2", "safest", ["b-share"])
    text = rv.proposal_text(v)
    assert "no arm meets all four. Kept: `late2`, the safest" in text
    assert "(b) no later than B1: 18/20 pairs no later than B1 = 90.0%, needs ≥ 95%" in text
    v = _choice(drop=("good", "good2", "late2", "slow07", *ASYNC))["criteria"]["smoothed"]
    assert v["proposed"] == "off" and v["fails"] == ["b-share", "b-median"]


def test_a_fedbuff_arm_is_held_to_issue_33s_goals_against_the_synchronous_default():
    v = _choice()["criteria"]["smoothed"]
    a3, a8 = _judged(v, "async3", "async"), _judged(v, "async8", "async")
    assert a3["against-default"] == "good"
    assert a3["meets-all"] and a3["fails"] == []
    assert a8["fails"] == ["idle"]
    idle = {c["check"]: c for c in a8["checks"]}["idle"]
    assert idle["measured"] == "median 8.0%, worst 8.0% over 20 runs"
    assert a3["idle-share-worst"] == pytest.approx(0.03)
    vs_default = {c["check"]: c for c in a3["checks"]}["time-default"]
    assert vs_default["measured"] == "20/20 pairs no later than `good` = 100.0%"
    assert a3["median-time-vs-b1"] == pytest.approx(0.3)


def test_the_async_arm_later_than_the_default_or_slower_than_half_b1_fails():
    pairs = {k: _arm_runs(k) for k in KEYS}
    for k in KEYS[:3]:  # later than good (4 s) in 3 of 20 pairs: 85%
        pairs[k]["async3"] = _reach(4.5, 50.0)
    for k in KEYS:  # 0.6× B1's time, but earlier than good2... still later than good
        pairs[k]["async8"] = _reach(6.0, 50.0)
    v = _choice(pairs=pairs)["criteria"]["smoothed"]
    assert _judged(v, "async3", "async")["fails"] == ["time-default"]
    assert _judged(v, "async8", "async")["fails"] == ["idle", "time-b1", "time-default"]


def test_paired_ratios_count_split_pairs_and_leave_out_where_neither_reaches():
    pairs = {
        ("f", 0): {"b1": _reach(10.0, 100.0), "x": _reach(None)},  # only B1: ∞
        ("f", 1): {"b1": _reach(None), "x": _reach(15.0, 150.0)},  # only x: B1 to its end
        ("f", 2): {"b1": _reach(None), "x": _reach(None)},  # neither: left out
        ("f", 3): {"b1": _reach(10.0, 100.0)},  # no run of x
        ("f", 4): {"b1": _reach(10.0, 100.0), "x": _reach(5.0, 200.0)},
    }
    p = rv.paired(pairs, "x", "b1", "smoothed")
    assert p.time == (math.inf, 0.5, 0.5) and p.energy == (math.inf, 0.5, 2.0)
    assert (p.ref_reached, p.missed, p.neither, p.absent) == (2, 1, (("f", 2),), 1)
    assert (p.n, p.no_later, p.no_more_energy, p.median_time) == (3, 2, 1, 0.5)


def _section(choice: dict[str, Any]) -> str:
    doc = Doc()
    rv.section(doc, choice, CRITERION_TITLES)
    return "\n".join(doc.lines)


def test_the_section_renders_the_criteria_the_verdict_and_the_async_goals():
    text = _section(_choice())
    assert text.startswith("## Choosing the default")
    assert "The study is complete: 20 pairs, 180 runs." in text
    assert "| `good` | pass: 0 missed of 20 pairs where B1 reaches it |" in text
    assert "| no: (b) share |" in text  # late2's row
    assert "**Verdict** (first round whose trailing mean reaches the target):" in text
    assert "Under the first round at or over the target: meet all four:" in text
    assert "the synchronous default compared with: `good`" in text
    assert "| `async8` |" in text and "| no: idle |" in text
    assert "No pair left out." in text
    text = _section(_choice(drop=tuple(ASYNC)))
    assert "No asynchronous (`fedbuff`) arm in this study" in text


def test_an_incomplete_study_gives_a_provisional_verdict_on_its_pairs():
    pairs = {k: _arm_runs(k) for k in KEYS[:12]}
    del pairs[KEYS[5]]["good"]
    choice = _choice(pairs=pairs)
    cov = choice["coverage"]
    assert (cov["planned-pairs"], cov["pairs"], cov["pairs-with-every-arm"]) == (20, 12, 11)
    assert (cov["planned-runs"], cov["runs"], cov["complete"]) == (180, 107, False)
    assert cov["no-run"] == {"good": [["f1", 0]]}
    text = _section(choice)
    assert "**Provisional:** the study is incomplete; this verdict stands on 12 of 20" in text
    assert "provisional: 12 of 20 planned pairs)" in text
    assert "no run of `good` in 1 of the 12 pairs (f1 seed 0)" in text
    good = {c["check"]: c for c in _judged(choice["criteria"]["smoothed"], "good")["checks"]}
    assert good["b-share"]["measured"] == "11/11 pairs no later than B1 = 100.0%"


def test_the_references_are_b1_and_off_by_name_else_the_plain_arm_of_their_method():
    plain = {"name": "plain", "method": "power-aware", "aggregation": "fedavg"}
    renamed = [plain if a["name"] == "off" else a for a in CONFIG["arms"]]
    choice = rv.choose_default({}, [], {**CONFIG, "arms": renamed})
    assert (choice["b1"], choice["off"]) == ("b1", "plain")
    # the default power-aware arm (aggregation = "auto": fedbuff) is not the synchronous off
    default = {"name": "default", "method": "power-aware"}
    arms = [{"name": "b1", "method": "b1"}, default, {**plain, "name": "sync"}]
    assert rv.choose_default({}, [], {**CONFIG, "arms": arms})["off"] == "sync"
    # criterion (d) says which arm it measured against
    pairs = {k: {**runs, "sync": runs["off"]} for k in KEYS for runs in [_arm_runs(k)]}
    checks = rv.judge_arm(pairs, "good", ("b1", "sync"), "smoothed")["checks"]
    assert [c["measured"] for c in checks if c["check"] == "d"] == [
        "20/20 pairs no later than `sync` = 100.0%"
    ]
    assert rv.choose_default({}, [], {**CONFIG, "arms": arms[:2]})["off"] is None


def test_a_study_without_b1_or_off_is_not_judged():
    steps = {"name": "steps", "method": "power-aware", "balance": "steps"}
    config = {**CONFIG, "arms": [{"name": "b1", "method": "b1"}, steps]}
    choice = rv.choose_default({k: _arm_runs(k) for k in KEYS}, [], config)
    assert choice["criteria"] == {} and choice["off"] is None
    assert "Not judged: the study needs a B1 arm and an `off` arm" in _section(choice)


@pytest.mark.usefixtures("flower_task_identity")
def test_the_report_judges_a_fedbuff_arm_from_its_recorded_run(tmp_path):
    """A fedbuff run's records (versions as rounds, its idle share) read as a cell."""
    run_dir = tmp_path / "fedbuff"
    summary = run_fedbuff_fake(run_dir, versions=6)["summary"]  # runs every version
    body = (
        'fleets = ["default"]\nseeds = 1\ntarget-accuracy = 0.3\ntarget-window = 1\n'
        'arms = [{ name = "b1", method = "b1" }, { name = "off", method = "power-aware" }, '
        '{ name = "fb", method = "power-aware", aggregation = "fedbuff" }]\n'
    )
    config = load_config(_write(tmp_path, body)).to_dict()
    rounds = _lines(run_dir / "rounds.jsonl")
    fb = {
        "seed": 0,
        "uses": [["default", "fb"]],
        "settings": {"aggregation": "fedbuff"},
        "summary": summary,
        "rounds": rounds,
        "nodes": _lines(run_dir / "nodes.jsonl"),
    }
    late = [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.9]  # round 8
    records = [_rec("default", 0, "b1", late, 2.0, 4.0), _rec("default", 0, "off", late, 1.0, 2.0)]
    out = _study_folder(tmp_path, config, [*records, fb])
    report = robustness.STUDY.render(out).read_text(encoding="utf-8")
    choice = json.loads((out / "summary.json").read_text())["choosing-the-default"]
    assert choice["async-arms"] == ["fb"] and choice["coverage"]["complete"]
    goals = {c["check"]: c for c in choice["criteria"]["smoothed"]["async"][0]["checks"]}
    # the version at the target and its virtual time, against B1's 8 rounds × 2 s
    version = first_round_at([r["accuracy"] for r in rounds], 0.3)
    assert version is not None and goals["a"]["pass"]
    assert goals["time-b1"]["value"] == pytest.approx(rounds[version - 1]["sim-time-s"] / 16.0)
    assert goals["idle"]["value"] == pytest.approx(summary["idle-share"])
    assert choice["criteria"]["smoothed"]["synchronous"] == "off"
    assert "## Choosing the default" in report and "| `fb` |" in report


def test_an_arm_that_runs_fedbuff_by_the_auto_default_is_asynchronous():
    """An arm that leaves ``aggregation`` to its ``auto`` default: its runs' summaries say
    what they resolved to."""
    arms = [{"name": "b1", "method": "b1"}, {"name": "pa", "method": "power-aware"}]
    records = [
        {"uses": [["f0", "pa"]], "settings": {}, "summary": {"aggregation": "fedbuff"}},
        {"uses": [["f0", "b1"]], "settings": {}, "summary": {"aggregation": "fedavg"}},
    ]
    assert rv.async_arms(arms, records) == ["pa"]
