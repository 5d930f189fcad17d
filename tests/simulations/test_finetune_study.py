"""The fine-tuning study: its file, the plan (fine-tuning and from-scratch cells), the
samples-to-target count, and a tiny study end to end from a given checkpoint (no data kit)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fl_client import checkpoint, data_splits, model_zoo, task
from simulations.cli import main
from simulations.experiments import finetune
from simulations.experiments.cell_worker import CellWorker
from simulations.experiments.config import ExperimentConfigError, FileOptions
from simulations.experiments.finetune import FinetuneConfig, plan, samples_to_target
from simulations.experiments.records import load_all
from simulations.experiments.registry import load_config

REPO = Path(__file__).resolve().parents[2]
TINY_FLEET = (
    '[[node]]\nname = "nano-4.5w"\ndevice = "jetson-nano"\np-max-w = 4.5\n\n'
    '[[node]]\nname = "orin-free"\ndevice = "jetson-orin-nano"\np-max-w = "none"\n'
)


def _tiny(fleet: Path, weights: Path) -> str:
    return f"""
[experiment]
name = "tiny-ft"
study = "finetune"
fleet = {json.dumps(str(fleet))}
methods = ["b1", "power-aware"]
dataset = "digits"
initial-weights = {json.dumps(str(weights))}
partitioning = "iid"
num-rounds = 2
target-accuracy = 0.6
local-epochs = 1
batch-sizes = [16, 64]
proxy-target-accuracy = 0.5
r-max-samples = 2048
seeds = 1
"""


def _load(path: Path, **options: object) -> FinetuneConfig:
    cfg = load_config(path, FileOptions(**options))  # type: ignore[arg-type]
    assert isinstance(cfg, FinetuneConfig)
    return cfg


def test_shipped_finetune_file_parses_at_both_scales() -> None:
    path = REPO / "configs" / "experiments" / "finetune.toml"
    mini = _load(path, scale="mini")
    paper = _load(path, scale="paper")
    assert (mini.model, mini.seeds, mini.pretrain_dataset) == ("cnn", 1, "mnist-subset")
    assert mini.proxy_dataset == "" and mini.dataset == "digits"
    assert paper.model == "resnet18" and paper.pretrain_epochs == 10
    assert mini.methods == ("b1", "b2", "power-aware", "oracle")


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('scenarios = ["balance-energy"]', "unknown key"),
        ("pretrain-epochs = 0", "pretrain-epochs"),
        ('torch-device = "tpu"', "torch-device: unknown value 'tpu'"),
        ('proxy-dataset = "  "', "proxy-dataset"),
    ],
)
def test_bad_finetune_files_name_the_key(tmp_path: Path, line: str, needle: str) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(TINY_FLEET)
    path = tmp_path / "ft.toml"
    path.write_text(_tiny(fleet, tmp_path / "w.safetensors") + line + "\n")
    with pytest.raises(ExperimentConfigError, match=needle):
        _load(path)


def test_the_plan_runs_every_method_from_both_starts(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(TINY_FLEET)
    path = tmp_path / "ft.toml"
    path.write_text(_tiny(fleet, tmp_path / "w.safetensors"))
    cfg = _load(path)
    weights = tmp_path / "abc.safetensors"
    cells = plan(cfg, weights, fleet)
    assert [c.uses for c in cells] == [
        (("fine-tuning", "b1"),),
        (("fine-tuning", "power-aware"),),
        (("from-scratch", "b1"),),
        (("from-scratch", "power-aware"),),
    ]
    assert [c.settings.get("initial-weights") for c in cells] == [str(weights)] * 2 + [None] * 2
    assert len({c.key() for c in cells}) == 4
    # another checkpoint (another sha256-named copy) never reuses a fine-tuning cell
    other = plan(cfg, tmp_path / "def.safetensors", fleet)
    assert other[0].key() != cells[0].key() and other[2].key() == cells[2].key()


def test_samples_to_target_counts_the_rounds_up_to_the_target() -> None:
    rec = {
        "summary": {"round-to-target": 2},
        "settings": {"local-epochs": 3},
        "nodes": [
            {"server-round": 1, "ok": True, "num-examples": 100},
            {"server-round": 1, "ok": False, "num-examples": 50},
            {"server-round": 2, "ok": True, "num-examples": 100},
            {"server-round": 3, "ok": True, "num-examples": 100},
        ],
    }
    assert samples_to_target(rec) == 600
    assert samples_to_target({**rec, "summary": {"round-to-target": None}}) is None


def _record(start: str, method: str, r: dict[str, float], r_cost_s: float) -> dict[str, object]:
    """A finished cell's record as the report reads it (2 rounds, both nodes in both)."""
    return {
        "start": start,
        "method": method,
        "settings": {"local-epochs": 1},
        "nodes": [{"server-round": k, "ok": True, "num-examples": 50} for k in (1, 1, 2, 2)],
        "summary": {
            "initial-accuracy": 0.4,
            "final-accuracy": 0.8,
            "round-to-target": 2,
            "sim-time-to-target-s": 3.0,
            "fleet-energy-to-target-j": 70.0,
            "fleet-busy-energy-to-target-j": 40.0,
            "device-train-time-s": 9.0,
            "device-profile-time-s": 1.0 if method == "power-aware" else 0.0,
            "r": r,
            "r-cost-s": r_cost_s,
        },
    }


def test_the_report_shows_busy_energy_and_r_from_any_cell_of_a_start(tmp_path: Path) -> None:
    """Idle-counted and busy energy side by side; a start whose ours cell is missing still
    has its proxy r (every cell of a start gets the same), with the host time of the cell
    that computed it, not of one that read it from the cache."""
    from simulations.experiments.finetune import proxy_r_by_start, render, rows
    from simulations.experiments.records import write_json

    ft_r, scratch_r = {"16": 0.5, "64": 1.0}, {"16": 0.8, "64": 1.0}
    records = [
        _record("fine-tuning", "b1", ft_r, 120.0),  # computed it
        _record("fine-tuning", "power-aware", ft_r, 0.3),  # read it from the cache
        _record("from-scratch", "b1", scratch_r, 400.0),  # no power-aware cell
    ]
    table = rows(records)
    ours = next(r for r in table if (r["start"], r["method"]) == ("fine-tuning", "power-aware"))
    assert (ours["energy-to-target-j"], ours["busy-energy-to-target-j"]) == (70.0, 40.0)
    assert ours["profile-share"] == pytest.approx(0.1) and ours["samples-to-target"] == 200
    by_start = proxy_r_by_start(table)
    assert list(by_start) == ["fine-tuning", "from-scratch"]
    assert by_start["fine-tuning"]["method"] == "power-aware"
    assert by_start["from-scratch"]["r"] == scratch_r
    for i, rec in enumerate(records):
        write_json(tmp_path / "records" / "cells" / f"{i}.json", rec)
    report = render(tmp_path).read_text()
    assert (
        "| fine-tuning | power-aware | 1 | 0.400 | 0.800 | 2.0 | 3.0 | 70.0 | 40.0 | 200 |"
        in report
    )
    assert "| fine-tuning | 0.50 | 1.00 | 120.0 |" in report
    assert "| from-scratch | 0.80 | 1.00 | 400.0 |" in report


@pytest.mark.slow
def test_tiny_finetune_study_runs_and_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The study's four cells, through ``powerfl experiment run``, one after another in
    one warm worker process (the engine starts once for the study)."""
    workers_warm: list[bool] = []  # per worker the study made
    pids: list[int] = []  # per cell, the worker process that ran it

    class Recording(CellWorker):  # the study's worker, noting the process of each cell
        def __init__(self, *, warm: bool = False) -> None:
            super().__init__(warm=warm)
            workers_warm.append(warm)

        def run(
            self,
            overrides: dict[str, Any],
            work: Path,
            timeout_s: float,
            on_line: Callable[[str], None] | None = None,
        ) -> tuple[dict[str, Any] | None, str]:
            result = super().run(overrides, work, timeout_s, on_line)
            pids.append(self.proc.pid)
            return result

    monkeypatch.setattr(finetune, "CellWorker", Recording)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(TINY_FLEET)
    splits = data_splits.load_splits("digits", 0)
    torch.manual_seed(0)
    model = model_zoo.build_model("cnn")
    task.train(model, splits.proxy_train, task.TrainOptions(batch_size=32, lr=3e-3, epochs=3))
    weights = tmp_path / "w.safetensors"
    checkpoint.save(model.state_dict(), weights)
    path = tmp_path / "ft.toml"
    path.write_text(_tiny(fleet, weights))
    out = tmp_path / "out"
    assert main(["experiment", "run", str(path), "--out", str(out), "--no-progress"]) == 0
    records = load_all(out / "records" / "cells")
    assert sorted((r["start"], r["method"]) for r in records) == [
        ("fine-tuning", "b1"),
        ("fine-tuning", "power-aware"),
        ("from-scratch", "b1"),
        ("from-scratch", "power-aware"),
    ]
    # every cell ran in the study's one warm worker (one engine start for the study)
    assert workers_warm == [True] and len(pids) == 4 and len(set(pids)) == 1
    assert {r["engine"] for r in records} == {"in-process-warm"}
    sha = checkpoint.file_sha256(weights)
    for r in records:
        got = r["summary"].get("initial-weights-sha256")
        assert got == (sha if r["start"] == "fine-tuning" else None)
    ft = [r for r in records if r["start"] == "fine-tuning"]
    scratch = [r for r in records if r["start"] == "from-scratch"]
    # round 0 is the checkpoint's accuracy, far above the random start's
    assert min(r["summary"]["initial-accuracy"] for r in ft) > 0.5
    assert max(r["summary"]["initial-accuracy"] for r in scratch) < 0.3
    report = (out / "report.md").read_text()
    assert "| fine-tuning | power-aware | 1 |" in report
    assert "## r on the proxy set" in report
