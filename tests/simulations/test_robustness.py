"""The robustness study: its file, plan, cells in one worker process (resumable), and the
report's two criteria, paired ratios and split pairs."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fl_server.results import RunRecorder
from fl_server.target import Target
from simulations.experiments import robustness
from simulations.experiments.cell_worker import CellWorker
from simulations.experiments.config import ExperimentConfigError, FileOptions
from simulations.experiments.federated import record_path
from simulations.experiments.registry import load_config
from simulations.experiments.report_kit import ReportError
from simulations.experiments.robustness_report import (
    pairs_of,
    reach,
    run_outcomes,
    summarize,
)
from strategies.power_aware import RoundReport
from tests.fl_server.test_results import _node

SHIPPED = "federated-robustness"


def _write(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "exp.toml"
    p.write_text(
        '[experiment]\nname = "t"\nstudy = "federated-robustness"\n' + body, encoding="utf-8"
    )
    return p


# --------------------------------------------------------------------------- the file


def test_the_shipped_file_declares_the_eight_arms_over_generated_and_shipped_fleets():
    cfg = load_config(SHIPPED)
    assert [a.name for a in cfg.arms] == [
        "b1",
        "off",
        "samples",
        "steps-fednova",
        "steps-fedavg",
        "steps-capped",
        "energy",
        "fedbuff",
    ]
    assert cfg.arm("fedbuff").overrides()["aggregation"] == "fedbuff"
    assert len(cfg.generated_fleets) >= 12 and cfg.seeds == 5
    assert Path(cfg.fleets[0]).stem == "default"
    assert cfg.arm("steps-fednova").overrides() == {
        "method": "power-aware",
        "aggregation": "fednova",
        "balance": "steps",
    }
    assert cfg.ratio_against == ("b1", "off")
    # the runs stop once both criteria are decided: at the 3-round mean's round
    assert cfg.base_overrides()["target-accuracy"] == cfg.target_accuracy == 0.8  # mini
    assert cfg.base_overrides()["target-window"] == cfg.target_window == 3


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('arms = [{ name = "a", method = "b9" }]', "arm a: method: unknown value 'b9'"),
        ('arms = [{ name = "A b", method = "b1" }]', "name must be lowercase"),
        ('arms = [{ name = "a", method = "b1", seed = 3 }]', "arm a: seed: set by the study"),
        (
            'arms = [{ name = "a", method = "power-aware", balanse = "steps" }]',
            "arm a: run settings: unknown key 'balanse'",
        ),
        ('arms = [{ name = "a", method = "power-aware", balance = "fast" }]', "arm a: balance"),
        (
            'arms = [{ name = "a", method = "b1" }, { name = "a", method = "b2" }]',
            "two arms named a",
        ),
        ('ratio-against = ["b3"]', "ratio-against: unknown value 'b3'"),
        ("generated-fleets = [1, -2]", "generated-fleets: must be a list of integers ≥ 0"),
        ("generated-fleets = [1, 1]", "duplicate seeds"),
        ("fleets = []\ngenerated-fleets = []", "fleets: no fleet"),
        ('engine = "ray"', "engine: unknown value 'ray'"),
        ("run-past-target = true", "run-past-target: retired: the runs stop once both"),
        ("smoothing-rounds = 3", "smoothing-rounds: renamed target-window"),
        ("target-window = 0", "target-window: expected an integer ≥ 1, got 0"),
        (
            'arms = [{ name = "a", method = "b1", target-window = 1 }]',
            "arm a: target-window: set by the study",
        ),
    ],
)
def test_bad_settings_are_errors_naming_the_key(tmp_path, body, message):
    if body.startswith("arms"):
        body += '\nratio-against = ["a"]'
    with pytest.raises(ExperimentConfigError, match=message.replace("(", r"\(")):
        load_config(_write(tmp_path, body + "\n"))


def test_overrides_cut_the_study_down(tmp_path):
    opts = FileOptions(seeds=2, sets={"fleets": [], "generated-fleets": [2, 6]})
    cfg = load_config(SHIPPED, opts)
    assert cfg.seeds == 2 and cfg.fleets == () and cfg.generated_fleets == (2, 6)
    cells = robustness.plan(cfg, tmp_path)
    assert len(cells) == 2 * 2 * 8


# --------------------------------------------------------------------------- the plan


def test_the_plan_runs_every_arm_on_every_fleet_and_seed_seed_by_seed(tmp_path):
    cfg = load_config(
        _write(
            tmp_path, 'fleets = ["default", "straggler-2x"]\ngenerated-fleets = [3]\nseeds = 2\n'
        )
    )
    cells = robustness.plan(cfg, tmp_path / "out")
    assert len(cells) == 3 * 2 * 6
    assert len({c.key() for c in cells}) == len(cells)
    fleets = [c.uses[0][0] for c in cells]
    assert fleets == (["default"] * 6 + ["straggler-2x"] * 6 + ["gen-3"] * 6) * 2
    assert [c.seed for c in cells] == [0] * 18 + [1] * 18
    assert {u[1] for c in cells for u in c.uses} == {a.name for a in cfg.arms}
    fedavg = next(c for c in cells if c.uses == (("gen-3", "steps-fedavg"),))
    assert fedavg.settings["aggregation"] == "fedavg" and fedavg.settings["balance"] == "steps"
    gen = tmp_path / "out" / "fleets" / "gen-3.toml"
    assert fedavg.settings["fleet"] == str(gen.resolve())
    text = gen.read_text(encoding="utf-8")
    robustness.plan(cfg, tmp_path / "out")  # written again: the same file
    assert gen.read_text(encoding="utf-8") == text
    robustness.check(cfg, tmp_path / "out")


def test_arms_with_the_same_settings_share_one_cell(tmp_path):
    body = (
        'fleets = ["default"]\nseeds = 1\narms = [{ name = "off", method = "power-aware" }, '
        '{ name = "off2", method = "power-aware", balance = "off" }, '
        '{ name = "b1", method = "b1" }]\n'
    )
    cfg = load_config(_write(tmp_path, body))
    cells = robustness.plan(cfg, tmp_path)
    assert len(cells) == 3  # balance = "off" is written out, so a cell of its own
    body = body.replace(', balance = "off"', "")
    cells = robustness.plan(load_config(_write(tmp_path, body)), tmp_path)
    assert len(cells) == 2
    assert cells[0].uses == (("default", "off"), ("default", "off2"))


def test_every_cell_stops_at_the_studys_target_by_its_window(tmp_path):
    body = 'fleets = ["default"]\nseeds = 1\ntarget-accuracy = 0.82\n'
    cells = robustness.plan(load_config(_write(tmp_path, body)), tmp_path / "a")
    assert len(cells) == 6
    assert {(c.settings["target-accuracy"], c.settings["target-window"]) for c in cells} == {
        (0.82, 3)
    }
    sets = {"fleets": ["default"], "generated-fleets": [], "target-window": 1}
    cfg = load_config(SHIPPED, FileOptions(seeds=1, sets=sets))
    cells = robustness.plan(cfg, tmp_path / "b")
    assert {(c.settings["target-accuracy"], c.settings["target-window"]) for c in cells} == {
        (0.8, 1)
    }


# --------------------------------------------------------------------------- criteria


def _recorded_run(folder: Path, accs: list[float], window: int) -> dict[str, Any]:
    """A run written by the run recorder (target 0.85), read back as a cell record: two
    nodes, so that one waits at idle power; round r takes r s and 10·r J on the slow one."""
    rec = RunRecorder(
        folder,
        method="power-aware",
        target=Target(0.85, window),
        console=Console(file=io.StringIO()),
    )
    rec.initial_eval({"accuracy": 0.1, "loss": 2.3})
    for rnd, acc in enumerate(accs, 1):
        nodes = [_node(rnd, "slow", float(rnd), 10.0 * rnd), _node(rnd, "fast", 0.5, 1.0)]
        rec.record_round(RoundReport(rnd, nodes), {"accuracy": acc, "loss": 1.0})
    summary = rec.finish()
    lines = {
        name: [json.loads(x) for x in (folder / name).read_text().splitlines()]
        for name in ("rounds.jsonl", "nodes.jsonl")
    }
    return {"summary": summary, "rounds": lines["rounds.jsonl"], "nodes": lines["nodes.jsonl"]}


@pytest.mark.parametrize("window", [1, 3, 4])
def test_the_reports_criteria_agree_with_the_runs_own_fields(tmp_path, window):
    """The report applies the run's two rules to its per-round records: the rounds, times
    and energies (idle waiting counted) it finds are the ones the run wrote."""
    rec = _recorded_run(tmp_path, [0.70, 0.86, 0.78, 0.84, 0.88, 0.87], window)
    s, got = rec["summary"], run_outcomes(rec, 0.85, window)
    assert s["idle-accounting"] == "on" and s["fleet-idle-energy-j"] > 0
    assert got["first"].round == s["first-round-at-target"] == 2
    assert got["first"].time_s == pytest.approx(s["sim-time-to-first-target-s"])
    assert got["first"].energy_j == pytest.approx(s["fleet-energy-to-first-target-j"])
    assert got["smoothed"].round == s["round-to-target"] == {1: 2, 3: 6, 4: None}[window]
    if s["round-to-target"] is not None:
        assert got["smoothed"].time_s == pytest.approx(s["sim-time-to-target-s"])
        assert got["smoothed"].energy_j == pytest.approx(s["fleet-energy-to-target-j"])


def _rec(fleet: str, seed: int, arm: str, accs: list[float], dt: float, e: float) -> dict:
    rounds = [
        {
            "server-round": i + 1,
            "accuracy": a,
            "sim-time-s": dt * (i + 1),
            "round-busy-energy-j": e * 0.75,
            "round-idle-energy-j": e * 0.25,
        }
        for i, a in enumerate(accs)
    ]
    nodes = [
        {"server-round": 1, "train-time-s": 1.0, "profile-time-s": 0.5, "shared-time-s": 0.5},
        *({"server-round": i + 2, "train-time-s": 1.0} for i in range(len(accs) - 1)),
    ]
    return {"seed": seed, "uses": [[fleet, arm]], "rounds": rounds, "nodes": nodes}


def test_reach_sums_energy_with_idle_and_the_profiling_share_to_the_round():
    r = reach(_rec("f", 0, "a", [0.1, 0.9, 0.9], 2.0, 4.0), 2)
    assert (r.round, r.time_s, r.energy_j) == (2, 4.0, 8.0)
    assert r.profile_share == pytest.approx(1.0 / 3.0)  # 1 s of profiling, 2 s of training
    missed = reach(_rec("f", 0, "a", [0.1, 0.2, 0.3], 2.0, 4.0), None)
    assert not missed.reached and missed.time_s == 6.0  # to the run's end


def test_the_summary_pairs_arms_and_lists_split_pairs_and_disagreements():
    up = [0.5, 0.9, 0.9, 0.9]
    records = [
        _rec("f", 0, "b1", up, 2.0, 4.0),
        _rec("f", 0, "off", up, 1.0, 2.0),
        _rec("f", 0, "steps", [0.5, 0.5, 0.5, 0.5], 1.0, 2.0),  # never
        _rec("f", 1, "b1", [0.5, 0.5, 0.5, 0.5], 2.0, 4.0),  # never
        _rec("f", 1, "off", [0.85, 0.6, 0.9, 0.9], 1.0, 1.0),  # lucky round 1
        _rec("f", 1, "steps", up, 0.5, 3.0),
    ]
    pairs = pairs_of(records, 0.8, 3)
    s = summarize(pairs, ["b1", "off", "steps"], ["b1", "off"])
    assert s["pairs"] == 2
    first = s["criteria"]["first"]
    assert first["b1"]["reached"] == 1 and first["off"]["reached"] == 2
    t = first["off"]["against"]["b1"]["time"]
    assert t["n"] == 1 and t["median"] == pytest.approx(0.5) and t["at-most-1"] == 1
    e = first["steps"]["against"]["off"]["energy"]  # seed 1 only: 2 rounds × 3 J ÷ 1 × 1 J
    assert e["n"] == 1 and e["worst"] == pytest.approx(6.0) and e["at-most-1"] == 0
    split = first["steps"]["against"]["b1"]["split"]
    assert [(x["seed"], x["reached-by"]) for x in split] == [(0, "b1"), (1, "steps")]
    assert "off" not in first["off"]["against"]
    # seed 1's off: round 1 at 0.85 is a lucky round; the 3-round mean reaches 0.8 at round 4
    dis = {
        (d["seed"], d["arm"]): (d["first-round"], d["smoothed-round"]) for d in s["disagreements"]
    }
    assert dis[(1, "off")] == (1, 4)
    assert dis[(0, "b1")] == (2, 4)
    assert s["criteria"]["smoothed"]["off"]["against"]["b1"]["time"]["median"] == pytest.approx(0.5)


# --------------------------------------------------------------------------- running


def fake_simulate(overrides: dict[str, Any]) -> dict[str, Any]:
    """A stand-in for a simulation (run in the worker process): writes a run folder with
    per-round and per-node records; ``sleep-s`` in the method's name makes it slow."""
    if overrides.get("method") == "b2":
        raise RuntimeError("b2 is not served here")
    if overrides.get("method") == "oracle":
        time.sleep(60)
    run = Path(overrides["output-dir"]) / "run"
    run.mkdir(parents=True)
    seed = int(overrides["seed"])
    accs = [0.3, 0.6, 0.7 + 0.15 * seed, 0.9, 0.9]
    rec = _rec("x", seed, "x", accs, 0.5, 3.0)
    (run / "rounds.jsonl").write_text("\n".join(json.dumps(r) for r in rec["rounds"]) + "\n")
    (run / "nodes.jsonl").write_text("\n".join(json.dumps(n) for n in rec["nodes"]) + "\n")
    print(f"round   1  accuracy {accs[0]:.3f}", flush=True)
    return {"run-dir": str(run), "nodes": {"n": {"rounds-ok": 5}}, "pid": os.getpid()}


def test_a_worker_runs_cells_one_after_another_in_one_process(tmp_path):
    worker = CellWorker(fake_simulate)
    lines: list[str] = []
    try:
        pids = []
        for i in range(2):
            work = tmp_path / f"c{i}"
            work.mkdir()
            ov = {"method": "b1", "seed": i, "output-dir": str(work / "out")}
            summary, why = worker.run(ov, work, 120, lines.append)
            assert why == "" and summary is not None
            pids.append(summary["pid"])
            assert "round   1" in (work / "simulate.log").read_text()
        assert pids[0] == pids[1] != os.getpid()
        assert any(line.startswith("round   1") for line in lines)
        work = tmp_path / "bad"
        work.mkdir()
        summary, why = worker.run({"method": "b2", "seed": 0, "output-dir": "x"}, work, 120)
        assert summary is None and "b2 is not served here" in why
        assert "Traceback" in (work / "simulate.log").read_text()
        work = tmp_path / "slow"
        work.mkdir()
        summary, why = worker.run({"method": "oracle", "seed": 0, "output-dir": "x"}, work, 3)
        assert summary is None and why == "timed out"
        assert not worker.proc.is_alive()
        work = tmp_path / "after"
        work.mkdir()
        ov = {"method": "b1", "seed": 0, "output-dir": str(work / "out")}
        summary, _ = worker.run(ov, work, 120)
        assert summary is not None and summary["pid"] != pids[0]  # a fresh worker
    finally:
        worker.close()
    assert not worker.proc.is_alive()


def test_the_study_runs_resumes_and_reports(tmp_path, monkeypatch):
    monkeypatch.setattr(robustness, "CellWorker", lambda warm: CellWorker(fake_simulate, warm=warm))
    body = (
        'fleets = ["default"]\ngenerated-fleets = [2]\nseeds = 2\n'
        'arms = [{ name = "b1", method = "b1" }, { name = "off", method = "power-aware" }]\n'
    )
    cfg = load_config(_write(tmp_path, body))
    out = tmp_path / "out"
    counts = robustness.run_study(cfg, out, progress=False)
    assert counts["cells"] == 8 and counts["cells-done"] == 8 and counts["cells-failed"] == 0
    again = robustness.run_study(cfg, out, progress=False)
    assert again["cells-done"] == 0 and again["cells-reused"] == 8
    recs = sorted((out / "records" / "cells").glob("*.json"))
    assert len(recs) == 8
    rec = json.loads(recs[0].read_text())
    assert rec["study"] == "federated-robustness" and rec["engine"] == "in-process-warm"
    (out / "manifest.json").write_text(
        json.dumps({"config": cfg.to_dict(), "study": cfg.study, "complete": True})
    )
    report = robustness.STUDY.render(out).read_text(encoding="utf-8")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pairs"] == 4 and summary["fleets"] == ["default", "gen-2"]
    # seed 0 reaches 0.8 in round 4 (first) and round 5 (smoothed); seed 1 in round 3 and 5
    runs = {(r["fleet"], r["seed"], r["arm"]): r for r in summary["runs"]}
    assert runs[("gen-2", 1, "off")]["first"]["round"] == 3
    assert runs[("gen-2", 1, "off")]["smoothed"]["round"] == 5
    assert "## Criterion: first round at or over the target" in report
    assert "## Where the two criteria disagree" in report
    assert "| `off` | 4/4 |" in report


def test_processes_sharing_a_folder_each_take_a_cell_nobody_holds(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setattr(robustness, "CellWorker", lambda warm: CellWorker(fake_simulate, warm=warm))
    body = (
        'fleets = ["default"]\nseeds = 2\narms = [{ name = "b1", method = "b1" }]\n'
        'ratio-against = ["b1"]\n'
    )
    cfg = load_config(_write(tmp_path, body))
    out = tmp_path / "out"
    cells = robustness.plan(cfg, out)
    assert len(cells) == 2
    # another process runs the first cell: it holds its lock
    (out / "locks").mkdir(parents=True)
    with open(out / "locks" / f"{cells[0].key()[:16]}.lock", "a+b") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        counts = robustness.run_study(cfg, out, progress=False)
    assert counts["cells-done"] == 1 and counts["cells-held-elsewhere"] == 1
    assert not robustness.complete(counts)  # a cell is still running elsewhere
    assert not record_path(out, cells[0]).exists()
    assert record_path(out, cells[1]).is_file()
    # its lock let go (the other process ended without a record): this one runs it
    counts = robustness.run_study(cfg, out, progress=False)
    assert counts["cells-done"] == 1 and robustness.complete(counts)
    # a cell whose record appeared after the plan was made is not run again
    monkeypatch.setattr(robustness, "pending", lambda cells, out: (list(cells), dict(
        {"cells": 2, "cells-done": 0, "cells-reused": 0, "cells-failed": 0,
         "cells-held-elsewhere": 0})))  # fmt: skip
    counts = robustness.run_study(cfg, out, progress=False)
    assert counts["cells-done"] == 0 and counts["cells-reused"] == 2


def _study_folder(tmp_path: Path, config: dict[str, Any], records: list[dict]) -> Path:
    out = tmp_path / "out"
    (out / "records" / "cells").mkdir(parents=True)
    for i, rec in enumerate(records):
        path = out / "records" / "cells" / f"r{i}.json"
        path.write_text(json.dumps({"key": f"k{i}", "cell-version": 4, **rec}))
    manifest = {"config": config, "study": "federated-robustness", "complete": True}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_a_folder_of_the_earlier_study_reads_its_window_from_smoothing_rounds(tmp_path):
    """Its runs went on to num-rounds with target 1.0; its config named the window
    smoothing-rounds: the report applies both criteria to its rounds as before."""
    body = 'fleets = ["default"]\nseeds = 1\narms = [{ name = "b1", method = "b1" }]\n'
    config = load_config(_write(tmp_path, body + 'ratio-against = ["b1"]\n')).to_dict()
    del config["target-window"]
    config["smoothing-rounds"] = 2
    records = [_rec("default", 0, "b1", [0.5, 0.9, 0.6, 0.9, 0.9], 1.0, 1.0)]
    out = _study_folder(tmp_path, config, records)
    robustness.STUDY.render(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["target-window"] == 2
    run = summary["runs"][0]
    assert (run["first"]["round"], run["smoothed"]["round"]) == (2, 5)  # 2-round means: 0.9


def test_two_records_of_one_pair_and_arm_are_refused_naming_them(tmp_path):
    body = 'fleets = ["default"]\nseeds = 1\narms = [{ name = "b1", method = "b1" }]\n'
    config = load_config(_write(tmp_path, body + 'ratio-against = ["b1"]\n')).to_dict()
    twice = [_rec("default", 0, "b1", [0.5, 0.9], 1.0, 1.0)] * 2
    out = _study_folder(tmp_path, config, twice)
    with pytest.raises(ReportError, match="two runs of fleet default, seed 0, arm b1: k0"):
        robustness.STUDY.render(out)
