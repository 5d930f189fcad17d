"""Experiment tracking (``simulations.tracking``): a finished run's records logged to a real
local MLflow store, read back with MLflow's own client; a run that cannot be logged keeps
its records and costs one warning; ``tracking = "mlflow"`` without MLflow is refused before
start.

The run is the default simulation's power-aware run whose records docs/simulation.md shows
(``docs/default-run``), copied, with its pictures drawn as ``powerfl simulate`` draws them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fl_client.settings import RunSettings, SettingsError
from simulations import tracking
from simulations.report import load_run
from simulations.report_cli import draw_simulate_pictures
from simulations.run import preflight
from tests.simulations.test_simulate_e2e import FLEET

REPO = Path(__file__).resolve().parents[2]
#: A finished run's records, as the default simulation wrote them.
DEFAULT_RUN = sorted((REPO / "docs" / "default-run").glob("*-power-aware"))[-1]
#: The files a run's records and pictures make (``settings.json`` beside them).
RECORDS = {"settings.json", "summary.json", "rounds.jsonl", "nodes.jsonl"}
PICTURES = {"timeline.png", "progress.png"}


@pytest.fixture(autouse=True)
def _no_failed_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracking, "_failed", set())


def _settings(out: Path, **overrides: Any) -> RunSettings:
    return RunSettings.from_config({"output-dir": str(out), "tracking": "mlflow", **overrides})


def _finished_run(out: Path, pictures: bool = True) -> Path:
    """A copy of the default run's folder in ``out``, with (``pictures``) the pictures
    ``simulate`` draws."""
    folder = out / DEFAULT_RUN.name
    shutil.copytree(DEFAULT_RUN, folder)
    if pictures:
        draw_simulate_pictures([folder])
    return folder


def _artifacts(client: Any, run_id: str) -> set[str]:
    return {a.path for a in client.list_artifacts(run_id)}


@pytest.mark.slow  # MLflow creates its SQLite store: 15-35 s here
def test_a_finished_run_is_in_the_local_store_with_its_settings_metrics_and_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mlflow = pytest.importorskip("mlflow")
    out = tmp_path / "runs"
    settings = _settings(out)
    folder = _finished_run(out)
    run = load_run(folder)

    tracked = tracking.log_run(settings, folder)

    assert tracked is not None
    assert tracked.uri == f"sqlite:///{out / 'mlflow.db'}" and (out / "mlflow.db").is_file()
    client = mlflow.tracking.MlflowClient(tracking_uri=tracked.uri)
    logged = client.get_run(tracked.run_id)
    assert logged.info.status == "FINISHED" and logged.info.run_name == folder.name
    assert client.get_experiment(logged.info.experiment_id).name == tracking.EXPERIMENT
    assert logged.data.tags["powerfl.method"] == "power-aware"
    # every setting the server recorded, kebab-case
    recorded = json.loads((folder / "settings.json").read_text())
    assert set(logged.data.params) == {k.replace("_", "-") for k in recorded}
    assert logged.data.params["method"] == recorded["method"] == "power-aware"
    assert logged.data.params["num-rounds"] == json.dumps(recorded["num_rounds"])
    assert logged.data.params["batch-sizes"] == json.dumps(recorded["batch_sizes"])
    # per-round metrics, one point per round, step = round, the records' values
    for key in ("accuracy", "loss", "sim-time-s", "fleet-energy-j"):
        history = client.get_metric_history(tracked.run_id, key)
        assert len(history) == len(run.rounds) == run.summary["rounds"] > 1
        assert [m.step for m in history] == [r["server-round"] for r in run.rounds]
        assert [m.value for m in history] == pytest.approx([r[key] for r in run.rounds])
    # per-node totals and the run's headline numbers
    metrics = logged.data.metrics
    for node, totals in run.summary["nodes"].items():
        for key in ("train-time-s", "train-energy-j", "idle-energy-j", "wait-s", "rounds-ok"):
            assert metrics[f"node/{node}/{key}"] == pytest.approx(totals[key]), (node, key)
    assert metrics.get("summary/round-to-target") == run.summary["round-to-target"]
    assert metrics["summary/fleet-energy-j"] == pytest.approx(run.summary["fleet-energy-j"])
    # the run folder's files, kept beside the store
    names = _artifacts(client, tracked.run_id)
    assert RECORDS | PICTURES | {tracking.TRACKING_RECORD} <= names
    assert (out / tracking.ARTIFACTS).is_dir()
    assert json.loads((folder / tracking.TRACKING_RECORD).read_text())["run-id"] == tracked.run_id
    assert f"mlflow       run {tracked.run_id} in sqlite:///" in capsys.readouterr().out


@pytest.mark.slow  # MLflow creates its SQLite store: 15-35 s here
def test_pictures_drawn_after_the_run_was_logged_are_added(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    out = tmp_path / "runs"
    settings = _settings(out)
    folder = _finished_run(out, pictures=False)
    tracked = tracking.log_run(settings, folder)
    assert tracked is not None
    client = mlflow.tracking.MlflowClient(tracking_uri=tracked.uri)
    assert not PICTURES & _artifacts(client, tracked.run_id)

    draw_simulate_pictures([folder])
    tracking.log_pictures(settings, [folder])

    assert _artifacts(client, tracked.run_id) >= PICTURES | RECORDS


def test_a_store_that_fails_warns_once_and_keeps_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mlflow")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    uri = f"sqlite:///{blocker / 'mlflow.db'}"  # a database inside a file: cannot be opened
    settings = _settings(tmp_path / "runs", **{"tracking-uri": uri})
    first = _finished_run(tmp_path / "runs")
    files = {p.name: p.read_bytes() for p in first.iterdir()}
    second = shutil.copytree(first, tmp_path / "runs" / "20261129-050000-power-aware")

    assert tracking.log_run(settings, first) is None
    assert tracking.log_run(settings, second) is None
    tracking.log_pictures(settings, [first, second])

    err = capsys.readouterr().err
    assert err.count("powerfl: warning: tracking:") == 1, err
    assert f"{first} was not logged to MLflow at {uri}" in err
    assert {p.name: p.read_bytes() for p in first.iterdir()} == files  # nothing lost or added


def test_a_tracking_password_is_never_shown() -> None:
    assert tracking.shown_uri("https://ann:s3cret@mlflow.lab:5000/x") == (
        "https://ann:***@mlflow.lab:5000/x"
    )
    assert tracking.shown_uri("sqlite:////tmp/mlflow.db") == "sqlite:////tmp/mlflow.db"


def test_params_are_strings_and_metrics_only_finite_numbers() -> None:
    params = tracking.run_params(
        {"cap_margin": 0.05, "fleet": "/a/b.toml", "profile_steps_train": True, "x": None}
    )
    assert params == {"cap-margin": "0.05", "fleet": "/a/b.toml", "profile-steps-train": "true",
                      "x": "null"}  # fmt: skip
    assert len(tracking.run_params({"long": "y" * 900})["long"]) == tracking.MAX_PARAM_CHARS
    rows = [{"server-round": 2, "accuracy": 0.5, "ok": True, "failed": ["n"], "deadline-s": None}]
    assert tracking.round_metrics(rows) == [("accuracy", 0.5, 2)]
    summary = {"rounds": 2, "method": "b1", "nodes": {"n-1": {"wait-s": 1.5, "caps": ["none"]}}}
    assert tracking.total_metrics(summary) == [("summary/rounds", 2.0, 0),
                                               ("node/n-1/wait-s", 1.5, 0)]  # fmt: skip


def test_mlflow_tracking_without_mlflow_is_refused_before_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    with pytest.raises(SettingsError) as err:
        preflight({"tracking": "mlflow"})
    assert str(err.value).startswith('tracking: "mlflow" needs MLflow')
    assert "pip install 'powerfl[tracking]'" in str(err.value)
    preflight({"tracking": "none"})  # the core install needs no MLflow


@pytest.mark.slow
def test_powerfl_simulate_logs_its_run_and_pictures(tmp_path: Path) -> None:
    """A real one-round ``powerfl simulate -c tracking=mlflow``: its run is in the local
    store in ``output-dir`` with its metrics and every file of its folder, the pictures
    drawn at the command's end included. The command logs the run after either engine has
    finished; the in-process one starts faster (the Simulation Runtime has its own test,
    ``test_simulate_e2e.test_simulate_through_flowers_simulation_runtime``)."""
    mlflow = pytest.importorskip("mlflow")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text("\n\n".join(FLEET.strip().split("\n\n")[:2]) + "\n")  # two nodes
    out = tmp_path / "runs"
    # batch-sizes and proxy-target-accuracy: less r estimation and profiling (the run is
    # not the point)
    args = "simulate --engine in-process --methods b1 --rounds 1 -c local-epochs=1"
    args += " -c target-accuracy=0.99 -c proxy-target-accuracy=0.3"
    args += " -c partitioning='iid' -c batch-sizes='32,64' -c tracking='mlflow'"
    cache = f"cache-dir={json.dumps(str(tmp_path / 'cache'))}"
    cmd = [sys.executable, "-m", "simulations", *args.split(), "-c", cache]
    cmd += ["--fleet", str(fleet), "--output-dir", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "warning: tracking" not in proc.stderr
    (run_dir,) = [p for p in out.iterdir() if p.is_dir() and p.name.endswith("-b1")]
    run_id = json.loads((run_dir / tracking.TRACKING_RECORD).read_text())["run-id"]
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    logged = client.get_run(run_id)
    assert logged.data.params["method"] == "b1" and logged.data.params["num-rounds"] == "1"
    assert len(client.get_metric_history(run_id, "accuracy")) == 1
    assert {"node/nano-4.5w/train-energy-j", "node/tx2nx-7w/train-energy-j"} <= set(
        logged.data.metrics
    )
    files = {p.name for p in run_dir.iterdir() if p.is_file()}
    assert files >= RECORDS | PICTURES | {"split.png"}
    assert _artifacts(client, run_id) >= files
