"""``powerfl pretrain``: the checkpoint and its record, resuming, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fl_client import checkpoint, data_splits, model_zoo, task
from fl_client.settings import REPO_ROOT
from simulations import pretrain
from simulations.cli import main


def _settings(**kw: object) -> pretrain.PretrainSettings:
    base: dict[str, object] = {
        "model": "cnn",
        "dataset": "digits",
        "epochs": 2,
        "target_accuracy": None,
        "max_epochs": 100,
        "batch_size": 64,
        "lr": 1e-3,
        "seed": 0,
    }
    return pretrain.PretrainSettings(**{**base, **kw})  # type: ignore[arg-type]


def test_pretrain_writes_a_checkpoint_that_a_run_can_start_from(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cnn.safetensors"
    rc = main(
        ["pretrain", "--model", "cnn", "--dataset", "digits", "--epochs", "2", "--out",
         str(out), "--torch-device", "cpu", "--quiet"]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    record = json.loads(pretrain.sidecar(out).read_text())
    assert record["model"] == "cnn" and record["dataset"] == "digits" and record["seed"] == 0
    assert record["epochs"] == 2 and len(record["history"]) == 2
    assert record["command"].startswith("powerfl ") and "--epochs 2" in record["command"]
    assert record["sha256"] == checkpoint.file_sha256(out)
    assert not pretrain.resume_path(out).exists()
    model = model_zoo.build_model("cnn")
    checkpoint.load_into(model, out)
    _, acc = task.evaluate(model, data_splits.load_splits("digits", 0).test)
    assert acc == pytest.approx(record["accuracy"])
    assert acc > 0.5  # two epochs on 1,497 digits: far above chance (0.1)
    assert checkpoint.read_metadata(out)["accuracy"] == record["accuracy"]


def test_the_same_settings_and_seed_give_the_same_checkpoint_bytes_in_any_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The oracle's r cache is keyed by the checkpoint's sha256: the path and the time of a
    run must not be in the file, or the same tensors would recompute r."""
    outs = [tmp_path / "a" / "cnn.safetensors", tmp_path / "elsewhere" / "other-name.safetensors"]
    for out in outs:
        argv = ["pretrain", "--model", "cnn", "--dataset", "digits", "--epochs", "1"]
        assert main([*argv, "--out", str(out), "--torch-device", "cpu", "--quiet"]) == 0
    capsys.readouterr()
    records = [json.loads(pretrain.sidecar(out).read_text()) for out in outs]
    assert checkpoint.file_sha256(outs[0]) == checkpoint.file_sha256(outs[1])
    assert records[0]["sha256"] == records[1]["sha256"] == checkpoint.file_sha256(outs[0])
    # the path and the time stay in the record beside the file, not in the file
    assert str(outs[1]) in records[1]["command"] and records[1]["train-time-s"] > 0
    meta = checkpoint.read_metadata(outs[1])
    assert meta["model"] == "cnn" and meta["seed"] == 0 and meta["epochs"] == 1
    assert not {"command", "train-time-s", "history"} & meta.keys()
    # other training settings are other bytes
    other = tmp_path / "seed1.safetensors"
    argv = ["pretrain", "--model", "cnn", "--dataset", "digits", "--epochs", "1", "--seed", "1"]
    assert main([*argv, "--out", str(other), "--torch-device", "cpu", "--quiet"]) == 0
    assert checkpoint.file_sha256(other) != checkpoint.file_sha256(outs[0])


def test_an_interrupted_pretraining_resumes_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = torch.device("cpu")
    whole = pretrain.pretrain(_settings(), tmp_path / "a.safetensors", cpu, ["x"], False)
    calls = {"n": 0}
    real = task.evaluate

    def crash_on_second_epoch(*args: object, **kw: object) -> tuple[float, float]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)  # type: ignore[arg-type]

    out = tmp_path / "b.safetensors"
    monkeypatch.setattr(task, "evaluate", crash_on_second_epoch)
    with pytest.raises(KeyboardInterrupt):
        pretrain.pretrain(_settings(), out, cpu, ["x"], False)
    assert pretrain.resume_path(out).is_file() and not out.exists()
    monkeypatch.setattr(task, "evaluate", real)
    resumed = pretrain.pretrain(_settings(), out, cpu, ["x"], False)
    assert resumed["epochs"] == 2
    assert resumed["history"][0] == whole["history"][0]
    a = checkpoint.read_state(tmp_path / "a.safetensors")
    b = checkpoint.read_state(out)
    assert all(torch.allclose(a[k].float(), b[k].float(), atol=1e-6) for k in a)
    # an unfinished run with other settings is not mixed with this command's
    monkeypatch.setattr(task, "evaluate", crash_on_second_epoch)
    calls["n"] = 0
    with pytest.raises(KeyboardInterrupt):
        pretrain.pretrain(_settings(), tmp_path / "c.safetensors", cpu, ["x"], False)
    monkeypatch.setattr(task, "evaluate", real)
    with pytest.raises(pretrain.SettingsError, match="unfinished pre-training with other"):
        pretrain.pretrain(_settings(lr=2e-3), tmp_path / "c.safetensors", cpu, ["x"], False)


def test_a_target_accuracy_stops_early_or_fails_with_exit_1(tmp_path: Path, capsys) -> None:
    out = tmp_path / "t.safetensors"
    argv = ["pretrain", "--model", "cnn", "--dataset", "digits", "--out", str(out), "--quiet"]
    assert main([*argv, "--target-accuracy", "0.3"]) == 0
    record = json.loads(pretrain.sidecar(out).read_text())
    assert record["target-reached"] is True and record["accuracy"] >= 0.3
    assert record["epochs"] == 1
    assert main([*argv, "--target-accuracy", "1.0", "--max-epochs", "1"]) == 1
    assert "did not reach --target-accuracy 1.0 in 1 epochs" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epochs", "1", "--target-accuracy", "0.5"], "not allowed with argument"),
        (["--epochs", "0"], "expected an integer >= 1"),
        (["--target-accuracy", "1.5"], "expected an accuracy in (0, 1]"),
        (["--epochs", "1", "--model", "vgg"], "invalid choice: 'vgg'"),
    ],
)
def test_a_bad_pretrain_command_is_refused(
    tmp_path: Path, capsys, argv: list[str], message: str
) -> None:
    base = ["pretrain", "--model", "cnn", "--dataset", "digits", "--out", str(tmp_path / "x")]
    with pytest.raises(SystemExit) as exc:
        main([*base, *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_an_unknown_dataset_is_refused_with_exit_2(tmp_path: Path, capsys) -> None:
    out = tmp_path / "x.safetensors"
    argv = ["pretrain", "--model", "cnn", "--epochs", "1", "--out", str(out)]
    assert main([*argv, "--dataset", str(tmp_path / "none.npz")]) == 2
    assert "dataset:" in capsys.readouterr().err
    assert not out.exists()


#: SIGINT at a moment of the second epoch, in a ``powerfl pretrain`` of its own process.
SIGINT_AT = """
import os, signal, sys
from simulations import cli, pretrain
calls = []
def at_second(real):
    def wrapped(*args, **kw):
        calls.append(1)
        out = real(*args, **kw)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return out
    return wrapped
{patch}
sys.exit(cli.main(sys.argv[1:]))
"""
#: after the second epoch's evaluation (before its resume file); after its resume file was
#: written to the temporary file, before the rename.
MOMENTS = {
    "evaluation": "pretrain.task.evaluate = at_second(pretrain.task.evaluate)",
    "resume-file": "pretrain.torch.save = at_second(pretrain.torch.save)",
}


@pytest.mark.parametrize("moment", MOMENTS)
def test_ctrl_c_during_pretraining_says_what_is_kept_in_one_line(
    tmp_path: Path, moment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cnn.safetensors"
    argv = ["pretrain", "--model", "cnn", "--dataset", "digits", "--epochs", "2", "--out",
            str(out), "--torch-device", "cpu", "--quiet"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", SIGINT_AT.format(patch=MOMENTS[moment]), *argv],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    resume = pretrain.resume_path(out)
    assert done.stderr.strip().splitlines() == [
        f"powerfl pretrain: interrupted by SIGINT; its finished epochs are kept in {resume}: "
        "run the same command again to go on from there"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [resume.name]  # no temporary file
    if moment == "resume-file":  # the first epoch's file is whole: the command goes on
        assert main(argv) == 0, capsys.readouterr().err
        assert json.loads(pretrain.sidecar(out).read_text())["epochs"] == 2
        assert not resume.exists()


def test_ctrl_c_before_the_first_epoch_finished_says_nothing_was_kept(tmp_path: Path) -> None:
    from simulations.pretrain_cli import interrupted_line
    from simulations.run import RunInterrupted

    line = interrupted_line(RunInterrupted(signal.SIGINT), tmp_path / "cnn.safetensors")
    assert line == (
        "powerfl pretrain: interrupted by SIGINT before its first epoch finished; no epoch to keep"
    )
