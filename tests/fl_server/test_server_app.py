"""fl_server.server_app: the strategy's TRAIN config carries the run's starting weights."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import torch
from rich.console import Console

from fl_client import checkpoint, task
from fl_client.contract import TrainConfig
from fl_client.settings import RunSettings
from fl_server.results import RunRecorder
from fl_server.server_app import make_strategy


def test_every_train_config_names_the_checkpoint_the_run_started_from(tmp_path: Path) -> None:
    """The nodes key the oracle's r by the checkpoint's sha256: the server sends it (the
    node never sees the file); a run from random weights sends none."""
    torch.manual_seed(0)
    path = tmp_path / "w.safetensors"
    checkpoint.save(task.build_model("cnn").state_dict(), path)
    weights = checkpoint.load_into(task.build_model("cnn"), path)
    settings = RunSettings.from_config(
        {"method": "oracle", "cache-dir": str(tmp_path / "cache"), "fleet": ""}
    )
    rec = RunRecorder(
        tmp_path / "run",
        method="oracle",
        target_accuracy=0.9,
        console=Console(file=io.StringIO()),
    )
    r_est = SimpleNamespace(batch_sizes=(32, 64), r=(0.5, 1.0))
    strategy = make_strategy(settings, r_est, rec, weights)
    sent = TrainConfig.from_config(strategy.template.to_config())
    assert sent.initial_weights_sha256 == checkpoint.file_sha256(path) == weights.sha256
    assert make_strategy(settings, r_est, rec).template.initial_weights_sha256 is None
