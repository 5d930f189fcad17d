"""``initial-weights`` at the command line: a bad checkpoint is refused before any engine
starts (exit 2), a good one is the round-0 global model and r's starting point, its sha256
is recorded and keys the r cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fl_client import checkpoint, data_splits, model_zoo, task
from simulations.cli import main

TWO = (
    '[[node]]\nname = "a"\ndevice = "jetson-nano"\np-max-w = 5\n\n'
    '[[node]]\nname = "b"\ndevice = "jetson-orin-nano"\np-max-w = "none"\n'
)
REPO = Path(__file__).resolve().parents[2]


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("this must never run",))


def _cnn_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return model_zoo.build_model("cnn").state_dict()


def _bad_checkpoint(tmp_path: Path, kind: str) -> Path:
    if kind == "missing":
        return tmp_path / "nope.safetensors"
    if kind == "pickle":
        path = tmp_path / "evil.pt"
        torch.save({"x": _Evil()}, path)
        return path
    if kind == "truncated":
        path = tmp_path / "cut.safetensors"
        checkpoint.save(_cnn_state(0), path)
        path.write_bytes(path.read_bytes()[:5000])
        return path
    if kind == "text":
        path = tmp_path / "hello.pt"
        path.write_text("hello")
        return path
    assert kind == "shape"
    state = _cnn_state(0)
    state["features.6.bias"] = torch.zeros(32)
    path = tmp_path / "wide.safetensors"
    checkpoint.save(state, path)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "initial-weights: {p}: no such file"),
        ("pickle", "initial-weights: {p}: refused: loading it would run code"),
        ("truncated", "initial-weights: {p}: not a readable safetensors file, truncated"),
        ("text", "initial-weights: {p}: not a checkpoint (neither a safetensors nor a torch"),
        ("shape", "initial-weights: {p}: features.6.bias is 32 in the checkpoint but 64 in"),
    ],
)
def test_a_bad_checkpoint_is_refused_before_any_engine_starts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    engine_starts: list[str],
    kind: str,
    message: str,
) -> None:
    (tmp_path / "two.toml").write_text(TWO)
    path = _bad_checkpoint(tmp_path, kind)
    out = tmp_path / "runs"
    cache = json.dumps(str(tmp_path / "c"))
    rc = main(
        ["simulate", "--fleet", str(tmp_path / "two.toml"), "--output-dir", str(out),
         "-c", f"initial-weights={json.dumps(str(path))}", "-c", f"cache-dir={cache}"]
    )  # fmt: skip
    err = capsys.readouterr()
    assert rc == 2
    assert message.format(p=path) in err.err
    assert "this must never run" not in err.out
    assert engine_starts == [] and not out.exists()


def _simulate(tmp_path: Path, weights: Path, out: Path, engine: str) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "simulations", "simulate", "--engine", engine,
        "--methods", "power-aware",
        "--fleet", str(tmp_path / "two.toml"), "--rounds", "1", "--output-dir", str(out),
        "-c", f"cache-dir={json.dumps(str(tmp_path / 'cache'))}",
        "-c", f"initial-weights={json.dumps(str(weights))}",
        "-c", "target-accuracy=0.99", "-c", "local-epochs=1", "-c", 'batch-sizes="32,64"',
        "-c", "proxy-target-accuracy=0.5", "-c", "partitioning='iid'",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return {
        "settings": json.loads((run_dir / "settings.json").read_text()),
        "summary": json.loads((run_dir / "summary.json").read_text()),
        "r": json.loads((run_dir / "r.json").read_text()),
        "stdout": proc.stdout,
    }


@pytest.mark.slow
def test_a_run_starts_from_the_checkpoint_and_a_changed_one_recomputes_r(
    tmp_path: Path,
) -> None:
    (tmp_path / "two.toml").write_text(TWO)
    splits = data_splits.load_splits("digits", 7)
    # weights trained a little on the proxy: round 0's accuracy is theirs, not chance
    torch.manual_seed(0)
    model = model_zoo.build_model("cnn")
    task.train(model, splits.proxy_train, task.TrainOptions(batch_size=32, lr=3e-3, epochs=3))
    _, acc = task.evaluate(model, splits.test)
    assert acc > 0.5
    weights = tmp_path / "w.safetensors"
    checkpoint.save(model.state_dict(), weights)
    # the first run through Flower's Simulation Runtime (the default engine), the second
    # in-process (it starts faster): both take the checkpoint and key r by it
    first = _simulate(tmp_path, weights, tmp_path / "runs1", "runtime")
    sha = checkpoint.file_sha256(weights)
    assert first["settings"]["initial_weights_sha256"] == sha
    assert first["settings"]["initial_weights_new_layers"] == []
    assert first["summary"]["initial-weights-sha256"] == sha
    assert first["summary"]["initial-accuracy"] == pytest.approx(acc, abs=1e-9)
    r_files = sorted((tmp_path / "cache" / "r").glob("r-*.json"))
    assert len(r_files) == 1
    # the same file changed after r was cached: its sha256 differs, r is estimated again
    task.train(
        model, splits.proxy_train, task.TrainOptions(batch_size=32, lr=3e-3, epochs=1, seed=1)
    )
    checkpoint.save(model.state_dict(), weights)
    _, acc2 = task.evaluate(model, splits.test)
    second = _simulate(tmp_path, weights, tmp_path / "runs2", "in-process")
    assert second["settings"]["initial_weights_sha256"] == checkpoint.file_sha256(weights) != sha
    assert second["summary"]["initial-accuracy"] == pytest.approx(acc2, abs=1e-9)
    assert len(sorted((tmp_path / "cache" / "r").glob("r-*.json"))) == 2
    assert second["r"]["cache_key"] != first["r"]["cache_key"]


def test_a_proxy_dataset_that_cannot_be_read_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "two.toml").write_text(TWO)
    out = tmp_path / "runs"
    missing = json.dumps(str(tmp_path / "none.npz"))
    rc = main(
        ["simulate", "--fleet", str(tmp_path / "two.toml"), "--output-dir", str(out),
         "-c", f"proxy-dataset={missing}"]
    )  # fmt: skip
    assert rc == 2
    assert "proxy-dataset: " in capsys.readouterr().err
    assert not out.exists()
