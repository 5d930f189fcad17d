"""The federated study: config validation, the cell plan, the report on synthetic version-2
records, and a tiny study end to end with resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulations.cli import main
from simulations.experiments.config import ExperimentConfigError, FileOptions
from simulations.experiments.federated import fixed_at_minimum_fleet, plan
from simulations.experiments.federated_config import CELL_VERSION, FederatedConfig
from simulations.experiments.records import load_all
from simulations.experiments.registry import load_config

REPO = Path(__file__).resolve().parents[2]

TINY_FLEET = """
[[node]]
name = "nano-4.5w"
device = "jetson-nano"
p-max-w = 4.5

[[node]]
name = "orin-free"
device = "jetson-orin-nano"
p-max-w = "none"
"""


def _tiny(fleet: Path) -> str:
    return f"""
[experiment]
name = "tiny-fed"
study = "federated"
fleet = {json.dumps(str(fleet))}
methods = ["b1", "power-aware"]
partitioning = "iid"
num-rounds = 2
target-accuracy = 0.6
local-epochs = 2
batch-sizes = [16, 64]
proxy-target-accuracy = 0.5
r-max-samples = 2048
seeds = 1
scenarios = []
"""


def load_federated(path: Path, **options: object) -> FederatedConfig:
    cfg = load_config(path, FileOptions(**options))  # type: ignore[arg-type]
    assert isinstance(cfg, FederatedConfig)
    return cfg


@pytest.fixture
def tiny_file(tmp_path: Path) -> Path:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(TINY_FLEET)
    p = tmp_path / "fed.toml"
    p.write_text(_tiny(fleet))
    return p


# --------------------------------------------------------------------------- config


def test_shipped_federated_file_parses_at_both_scales():
    path = REPO / "configs" / "experiments" / "federated.toml"
    mini = load_federated(path, scale="mini")
    paper = load_federated(path, scale="paper", seeds=3)
    assert isinstance(mini, FederatedConfig)
    assert mini.methods == ("b1", "b2", "power-aware", "oracle")
    assert mini.scenarios == ("balance-energy", "varying-cap", "drift")
    assert mini.deadline_margin == 0.05
    assert (mini.seeds, mini.num_rounds, mini.target_accuracy) == (2, 20, 0.8)
    assert (paper.seeds, paper.num_rounds, paper.target_accuracy) == (3, 40, 0.85)


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ("bogus-key = 1\n", "unknown key(s) bogus-key"),
        ('methods = ["b1", "magic"]\n', "methods: unknown value 'magic'"),
        ("methods = []\n", "methods: must be a non-empty list (empty sweep)"),
        ('scenarios = ["weather"]\n', "scenarios: unknown value 'weather'"),
        ("num-rounds = 0\n", "num-rounds: expected an integer ≥ 1, got 0"),
        ("target-accuracy = 1.5\n", "target-accuracy: must be in (0.0, 1.0], got 1.5"),
        ('partitioning = "shards"\n', "partitioning: unknown value 'shards'"),
        ('fleet = "no/such/fleet.toml"\n', "fleet: fleet: fleet file not found"),
        (
            'scenarios = ["varying-cap"]\nvarying-cap-fleet = "default"\n',
            "configs/fleets/default.toml: no node has a p-max-schedule",
        ),
        (
            'scenarios = ["drift"]\ndrift-fleet = "default"\n',
            "configs/fleets/default.toml: no node has twin-slowdown",
        ),
        ("drift-check-every = 0\n", "drift-check-every: expected an integer ≥ 1 (the drift"),
        ('balance-modes = ["off", "fast"]\n', "balance-modes: unknown value 'fast'"),
        ("balance-modes = []\n", "balance-modes: must be a non-empty list"),
        ("balance-fleets = []\n", "balance-fleets: must be a non-empty list of fleet names"),
        ('balance-fleets = ["default", "default"]\n', "balance-fleets: two fleets of the same"),
        ('critical-r-arms = ["steps"]\n', "critical-r-arms: each entry must be MODE@W"),
        ('critical-r-arms = ["off@0.5"]\n', "critical-r-arms: each entry must be MODE@W"),
        ('critical-r-arms = ["steps@0"]\n', "critical-r-arms: each entry must be MODE@W"),
        ('critical-r-arms = ["steps@1.5"]\n', "critical-r-arms: each entry must be MODE@W"),
        ('critical-r-arms = ["steps@x"]\n', "critical-r-arms: each entry must be MODE@W"),
        ('critical-r-arms = ["steps@1", "steps@1.0"]\n', "critical-r-arms: duplicate arms"),
        ('critical-r-arms = "steps@1"\n', "critical-r-arms: must be a list"),
        (
            'scenarios = ["balance"]\nbalance-fleets = ["no/such/fleet.toml"]\n',
            "balance-fleets: fleet: fleet file not found",
        ),
        # a fleet that does not exist, in a scenario the file leaves out: a bad value all the same
        (
            'balance-fleets = ["default", "no-such-fleet"]\n',
            "balance-fleets: fleet: fleet file not found",
        ),
        ('drift-fleet = "no-such-fleet"\n', "drift-fleet: fleet: fleet file not found"),
        # the study's name names its output folder
        ('name = "../../escaped"\n', "name: '../../escaped' cannot be used as a name"),
        ('name = "a/b"\n', "name: 'a/b' cannot be used as a name"),
    ],
)
def test_bad_federated_files_name_the_key(tiny_file, patch, needle):
    keys = {ln.split("=")[0].strip() for ln in patch.splitlines()}
    lines = [
        ln for ln in tiny_file.read_text().splitlines() if ln.split("=")[0].strip() not in keys
    ]
    tiny_file.write_text("\n".join(lines) + "\n" + patch)
    with pytest.raises(ExperimentConfigError) as err:
        load_federated(tiny_file)
    assert needle in str(err.value)


def test_cli_rejects_bad_federated_file_before_any_run(tiny_file, tmp_path, capsys):
    tiny_file.write_text(tiny_file.read_text().replace('"power-aware"]', '"ours"]'))
    out = tmp_path / "out"
    rc = main(["experiment", "run", str(tiny_file), "--out", str(out), "--no-progress"])
    assert rc == 2
    assert "methods: unknown value 'ours'" in capsys.readouterr().err
    assert not out.exists()


def test_keys_of_scenarios_the_file_leaves_out_are_named_in_one_warning(
    tiny_file, tmp_path, capsys
):
    """An experiment file is shared across scenarios: keys no scenario of this run reads are
    named at start (not refused), in one line; the defaults of keys it leaves out are not."""
    tiny_file.write_text(
        tiny_file.read_text()
        + 'balance-modes = ["off", "steps"]\ncritical-r-arms = ["steps@0.5"]\n'
        + 'balance-fleets = ["default"]\ndeadline-margin = 0.1\n'
    )
    blocker = tmp_path / "a-file"  # --out a file: refused after the warning, before any run
    blocker.write_text("")
    rc = main(["experiment", "run", str(tiny_file), "--out", str(blocker), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    warnings = [ln for ln in err.splitlines() if "warning" in ln]
    assert len(warnings) == 1, err
    for key in ("balance-fleets", "balance-modes", "critical-r-arms", "deadline-margin"):
        assert f"{key} (scenario " in warnings[0]
    assert "drift-fleet" not in warnings[0] and "scenario-method" not in warnings[0]
    assert "--out" in err  # then the refusal


def test_a_run_into_another_experiments_output_folder_is_refused(tiny_file, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    other = {"study": "single-device", "config": {"name": "cifar", "scale": "paper"}}
    (out / "manifest.json").write_text(json.dumps(other))
    (out / "experiment.toml").write_text("# the other study's file\n")
    rc = main(["experiment", "run", str(tiny_file), "--out", str(out), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--out: " in err and "holds the output of another experiment" in err
    assert "study single-device, name cifar, scale paper" in err
    assert "study federated, name tiny-fed, scale mini" in err
    assert json.loads((out / "manifest.json").read_text()) == other  # left as it was
    assert (out / "experiment.toml").read_text() == "# the other study's file\n"
    assert sorted(p.name for p in out.iterdir()) == ["experiment.toml", "manifest.json"]


def test_a_file_whose_keys_all_take_effect_has_no_warning(tiny_file):
    from simulations.experiments.config import given_keys, read_experiment_file

    data, _ = read_experiment_file(tiny_file)
    cfg = load_federated(tiny_file)
    assert cfg.unused_keys(given_keys(data, FileOptions())) == []
    balance = load_federated(tiny_file, sets={"scenarios": ["balance"], "balance-modes": ["off"]})
    assert balance.unused_keys({"balance-modes", "scenarios"}) == []


def test_balance_study_plans_every_arm_per_fleet_and_seed_fleet_by_fleet(tmp_path):
    path = REPO / "configs" / "experiments" / "federated-balance.toml"
    cfg = load_federated(path, scale="mini")
    assert cfg.seeds >= 5 and cfg.scenarios == ("balance",)
    cells = plan(cfg, tmp_path)
    fleets = ["default", "straggler-2x", "straggler-5x", "straggler-1.2x"]
    assert [Path(f).stem for f in cfg.balance_fleets] == fleets  # resolved: shipped names
    weighted = ("steps@0.5", "steps@1")  # critical-r-arms: the pace-setter's r weight
    arms = ("b1", "off", "samples", "steps", "energy", *weighted)
    # the methods' power-aware (aggregation = "auto": asynchronous) is a cell of its own
    # beside the balance arms' off (synchronous FedAvg rounds without a plan)
    methods = [c for c in cells if ("methods", "power-aware") in c.uses]
    assert len(methods) == cfg.seeds and all(len(c.uses) == 1 for c in methods)
    assert all("aggregation" not in c.settings for c in methods)
    assert len(cells) == len(fleets) * cfg.seeds * len(arms) + len(methods)
    # fleet by fleet, seed by seed: a study cut short has whole fleets and seeds
    order = [(Path(str(c.settings["fleet"])).stem, c.seed) for c in cells]
    assert order == sorted(order, key=lambda fs: (fleets.index(fs[0]), fs[1]))
    first = [c for c in cells if c not in methods][: len(arms)]
    assert [dict(c.uses).get("balance") for c in first] == [f"default/{arm}" for arm in arms]
    assert first[1].settings["aggregation"] == "fedavg" and "balance" not in first[1].settings
    assert [c.settings.get("balance") for c in first[2:5]] == ["samples", "steps", "energy"]
    assert first[0].method == "b1" and "balance" not in first[0].settings
    # the weighted arms: steps with the pace-setter's r weighed; no other cell sets it
    assert [(c.settings["balance"], c.settings["critical-r-weight"]) for c in first[5:]] == [
        ("steps", 0.5),
        ("steps", 1.0),
    ]
    assert all("critical-r-weight" not in c.settings for c in first[:5])


def test_plan_shares_identical_cells_and_derives_the_fixed_minimum_fleet(tmp_path):
    cfg = load_federated(REPO / "configs" / "experiments" / "federated.toml", seeds=1)
    cells = plan(cfg, tmp_path)
    uses = [u for c in cells for u in c.uses]
    # 4 methods + 2 balance energy + 2 varying-cap + 2 drift; balance "off" is synchronous
    # (aggregation = "auto" makes the methods' power-aware asynchronous)
    assert len(cells) == 10 and len(uses) == 10
    (shared,) = [c for c in cells if ("balance-energy", "off") in c.uses]
    assert shared.settings["aggregation"] == "fedavg" and len(shared.uses) == 1
    energy = next(c for c in cells if ("balance-energy", "energy") in c.uses).settings
    drift_on = next(c for c in cells if ("drift", "check") in c.uses).settings
    drift_off = next(c for c in cells if ("drift", "off") in c.uses).settings
    assert (energy["balance"], energy["deadline-margin"]) == ("energy", 0.05)
    assert "balance" not in shared.settings  # the run's default, off
    assert {k: v for k, v in energy.items() if k not in ("balance", "deadline-margin")} == {
        k: v for k, v in shared.settings.items() if k != "aggregation"
    }
    assert (drift_on["drift-check-every"], drift_off["drift-check-every"]) == (2, 0)
    assert len({c.key() for c in cells}) == len(cells)
    # the fixed-at-minimum fleet: each schedule replaced by its lowest cap
    from fl_client.settings import load_fleet

    fixed = next(c for c in cells if ("varying-cap", "fixed-at-minimum") in c.uses)
    nodes = {n.name: n for n in load_fleet(fixed.settings["fleet"])}
    sched = {n.name: n for n in load_fleet(REPO / "configs" / "fleets" / "varying-cap.toml")}
    assert set(nodes) == set(sched)
    for name, n in sched.items():
        assert not nodes[name].p_max_schedule
        assert nodes[name].p_max == min(n.scheduled_caps)
    assert nodes["nano-solar-1"].p_max.watts == 4.5 and nodes["nano-battery"].p_max.watts == 5.0


def test_fixed_minimum_of_a_schedule_with_none_keeps_the_lowest_number(tmp_path):
    f = tmp_path / "f.toml"
    f.write_text('[[node]]\nname = "a"\ndevice = "jetson-nano"\np-max-schedule = "1:none,3:6.0"\n')
    text = fixed_at_minimum_fleet(f)
    assert "p-max-w = 6.0" in text and "\np-max-schedule" not in text


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_tiny_federated_study_runs_reports_and_resumes(tiny_file, tmp_path):
    out = tmp_path / "out"
    args = ["experiment", "run", str(tiny_file), "--out", str(out), "--no-progress"]
    assert main(args) == 0
    recs = load_all(out / "records" / "cells")
    assert sorted(r["method"] for r in recs) == ["b1", "power-aware"]
    for r in recs:
        s = r["summary"]
        k = len(r["rounds"])  # a run stops at the round that reaches the target
        assert s["record-version"] == 4 and r["cell-version"] == CELL_VERSION
        assert [x["server-round"] for x in r["rounds"]] == list(range(1, k + 1))
        if r["method"] == "power-aware":  # aggregation = "auto": fedbuff, versions as rounds
            assert s["aggregation"] == "fedbuff" and all(n["ok"] for n in r["nodes"])
        else:  # B1: synchronous rounds of both nodes
            assert k == 2 or s["round-to-target"] == k
            assert len(r["nodes"]) == 2 * k and all(n["ok"] for n in r["nodes"])
        assert s["method"] == r["method"] and s["rounds"] == k
        assert s["fleet-busy-energy-j"] == pytest.approx(
            s["fleet-train-energy-j"] + s["fleet-profile-energy-j"]
        )
        assert s["fleet-energy-j"] == pytest.approx(
            s["fleet-busy-energy-j"] + s["fleet-idle-energy-j"]
        )
        assert Path(r["run-dir"]) == Path(s["run-dir"]) and Path(r["log"]).is_file()
        assert r["settings"]["partitioning"] == "iid" and r["settings"]["seed"] == 0
        # the recorder's accounting, as the report reads it: fleet busy energy = training +
        # profiling = the sum of the nodes' totals; idle waiting = the nodes' idle energy;
        # the headline (idle-accounting = on, the default) is their sum (fedbuff's too: one
        # account of the devices' energy, async.md)
        totals = s["nodes"].values()
        e = sum(t["train-energy-j"] + t["profile-energy-j"] for t in totals)
        assert s["fleet-busy-energy-j"] == pytest.approx(e)
        assert s["fleet-idle-energy-j"] == pytest.approx(sum(t["idle-energy-j"] for t in totals))
        assert s["idle-accounting"] == "on"
        assert s["fleet-energy-j"] == pytest.approx(e + s["fleet-idle-energy-j"])
        if r["method"] == "power-aware":
            continue  # fedbuff's rows are its applied updates; its figures count every work
        # training = the sum of nodes.jsonl
        train = sum(n["train-energy-j"] for n in r["nodes"])
        assert s["fleet-train-energy-j"] == pytest.approx(train)
    by = {r["method"]: r for r in recs}
    assert by["power-aware"]["summary"]["device-profile-time-s"] > 0  # fresh cache: it profiled
    assert by["b1"]["summary"]["device-profile-time-s"] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["counts"]["cells-done"] == 2
    report = (out / "report.md").read_text()
    assert "federated study (mini scale)" in report
    assert "Straggler share" in report and "Per-device time and energy breakdown" in report
    assert "powerfl experiment run" in report and "- flwr " in report
    for name in ("fig-accuracy-vs-time", "fig-energy-to-target"):
        assert (out / f"{name}.png").stat().st_size > 1000
    rows = (out / "fig-accuracy-vs-time.csv").read_text().splitlines()
    assert len(rows) == 1 + sum(1 + len(r["rounds"]) for r in recs)  # header, round 0 + rounds
    summary = json.loads((out / "summary.json").read_text())
    for m in ("b1", "power-aware"):
        g = summary["methods"][m]
        per = summary["per-seed"]["methods"][m]["0"]
        assert g["seeds"] == 1
        assert per["energy-j"] == pytest.approx(per["busy-energy-j"] + per["idle-energy-j"])
        assert math.isclose(g["sim-time-s-mean"], by[m]["summary"]["sim-time-s"])
    # resume: nothing re-runs, the records are untouched
    stamps = {p: p.stat().st_mtime_ns for p in (out / "records" / "cells").glob("*.json")}
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["cells-done"] == 0 and manifest["counts"]["cells-reused"] == 2
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    # the report re-renders from the records alone
    (out / "report.md").unlink()
    assert main(["experiment", "report", str(out)]) == 0
    assert "Straggler share" in (out / "report.md").read_text()


# --------------------------------------------------------------------------- engine start


def _fake_child(outcomes: list[str]):
    """A stand-in for ``run_in_child`` whose attempts end as ``outcomes`` says: ``start``
    (Ray's node timed out during startup, nothing ran), ``crash`` (it failed after round
    1) or ``ok``; it records the attempts."""
    calls: list[str] = []

    def child(simulate, overrides, work, timeout_s, on_line=None):
        outcome = outcomes[len(calls)]
        calls.append(outcome)
        log = {
            "start": "Exception: The current node timed out during startup. This could …\n",
            "crash": "round   1  accuracy 0.300  round 0.2 s\nTraceback: boom\n",
            "ok": "round   1  accuracy 0.900\n",
        }[outcome]
        (work / "simulate.log").write_text(log, encoding="utf-8")
        if outcome != "ok":
            return None, "exit status 1"
        run = work / "run"
        run.mkdir(exist_ok=True)
        return {"nodes": {"n": {"rounds-ok": 1}}, "run-dir": str(run)}, ""

    return child, calls


def _one_cell(tmp_path: Path, tiny_file: Path):
    return plan(load_federated(tiny_file), tmp_path)[0]


def test_a_cell_whose_engine_did_not_start_is_started_again(tmp_path, tiny_file, monkeypatch):
    from simulations.experiments import federated

    child, calls = _fake_child(["start", "start", "ok"])
    monkeypatch.setattr(federated, "run_in_child", child)
    rec = federated.run_cell(_one_cell(tmp_path, tiny_file), tmp_path, timeout_s=10)
    assert calls == ["start", "start", "ok"] and rec["summary"]["nodes"]["n"]["rounds-ok"] == 1


def test_an_engine_that_never_starts_fails_the_cell_after_the_retries(
    tmp_path, tiny_file, monkeypatch
):
    from simulations.experiments import federated

    child, calls = _fake_child(["start"] * (1 + federated.ENGINE_START_RETRIES))
    monkeypatch.setattr(federated, "run_in_child", child)
    with pytest.raises(RuntimeError, match="failed"):
        federated.run_cell(_one_cell(tmp_path, tiny_file), tmp_path, timeout_s=10)
    assert len(calls) == 1 + federated.ENGINE_START_RETRIES


def test_a_run_that_failed_after_starting_is_not_run_again(tmp_path, tiny_file, monkeypatch):
    from simulations.experiments import federated

    child, calls = _fake_child(["crash", "ok"])
    monkeypatch.setattr(federated, "run_in_child", child)
    with pytest.raises(RuntimeError, match="failed"):
        federated.run_cell(_one_cell(tmp_path, tiny_file), tmp_path, timeout_s=10)
    assert calls == ["crash"]


def test_balance_fleets_in_a_file_are_relative_to_its_folder(tmp_path, tiny_file, monkeypatch):
    text = tiny_file.read_text().replace("scenarios = []", 'scenarios = ["balance"]')
    tiny_file.write_text(text + 'balance-fleets = ["fleet.toml", "default"]\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_federated(tiny_file)
    assert cfg.balance_fleets[0] == str(tmp_path / "fleet.toml")
    assert Path(cfg.balance_fleets[1]).name == "default.toml"  # a shipped fleet's name
    variants = {dict(c.uses).get("balance", "") for c in plan(cfg, tmp_path / "out")}
    assert {"fleet/b1", "fleet/energy", "default/off"} <= variants
