"""Issue 12 §1–§3, §7 at the command line: nothing silently ignored, nothing hangs, signals
end runs cleanly (one line, 130/143, no process left, valid records), relative paths from
the current directory, and a bad command fails before PyTorch or Flower is imported."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from fl_client.settings import REPO_ROOT
from fl_client.shipped import shipped_dir
from simulations import cli, run
from simulations.cli import choose_methods, main
from strategies.fleet import Fleet

TWO = (
    '[[node]]\nname = "a"\ndevice = "jetson-nano"\np-max-w = 5\n\n'
    '[[node]]\nname = "b"\ndevice = "jetson-orin-nano"\np-max-w = "none"\n'
)
ONE = '[[node]]\nname = "solo"\ndevice = "jetson-nano"\np-max-w = 5\n'


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_HOME": str(tmp_path / ".flwr"),
    }


CLI = "import sys; from simulations.cli import main; sys.exit(main(sys.argv[1:]))"


def _powerfl(tmp_path: Path, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path),
        # a background job's SIGINT is ignored, and that is respected: give it the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


# ----------------------------------------------------------- §1: nothing silently ignored


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["-c", "frobnicate=1"],
            "run settings: unknown key 'frobnicate'; known keys: aggregation, "
            "allow-untrained-nodes, b-ref",
        ),
        (["-c", "cap-margn=0.5"], "run settings: unknown key 'cap-margn' (did you mean cap-"),
        (
            ["-c", "method=b1", "--methods", "power-aware"],
            "method: -c method=b1 and --methods power-aware both choose what runs",
        ),
        (["-c", "fixed-freq-mhz=460.8"], "fixed-freq-mhz: only the fixed method uses it"),
        (
            ["--methods", "fixed", "-c", "fixed-batch-size=32", "-c", "fixed-freq-mhz=500"],
            "fixed-freq-mhz: 500 MHz is not in the frequency table of node a (jetson-nano)",
        ),
        (["-c", "round-timeout-s=5"], "round-timeout-s: 5 s is too short to be meant"),
        (["-c", "seed=1", "-c", "seed=2"], "seed: given twice (-c seed=1, -c seed=2)"),
        (["--rounds", "3", "-c", "num-rounds=5"], "num-rounds: --rounds 3 and -c num-rounds=5"),
        (
            ["-c", "aggregation=fednva"],
            "aggregation: unknown value 'fednva'; allowed: auto, fedavg, fednova, "
            "fedavg-capped, fedbuff",
        ),
        (["-c", "idle-accounting=yes"], "idle-accounting: unknown value 'yes'; allowed: on, off"),
    ],
)
def test_bad_settings_are_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    (tmp_path / "two.toml").write_text(TWO)
    out = tmp_path / "runs"
    rc = main(["simulate", "--fleet", str(tmp_path / "two.toml"), "--output-dir", str(out), *args])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_misspelt_fleet_key_is_refused_not_run_uncapped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "f.toml").write_text(TWO.replace("p-max-w = 5", "p-max_w = 4.5"))
    assert main(["simulate", "--fleet", str(tmp_path / "f.toml")]) == 2
    assert "unknown key 'p-max_w' (did you mean p-max-w?)" in capsys.readouterr().err


def test_which_methods_run() -> None:
    """-c method=M alone runs M, as ``flwr run --run-config "method='M'"`` does."""
    assert choose_methods(None, {}) == ["power-aware", "b1"]
    overrides: dict[str, Any] = {"method": "b2"}
    assert choose_methods(None, overrides) == ["b2"] and "method" not in overrides
    assert choose_methods("b1,oracle", {}) == ["b1", "oracle"]
    assert choose_methods("b1", {"method": "b1"}) == ["b1"]


# --------------------------------------------------------------------- §2: nothing hangs


def test_a_fleet_smaller_than_min_train_nodes_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "one.toml").write_text(ONE)
    t0 = time.perf_counter()
    rc = main(["simulate", "--fleet", str(tmp_path / "one.toml"), "--output-dir", str(tmp_path)])
    assert rc == 2 and time.perf_counter() - t0 < 10
    err = capsys.readouterr().err
    assert "min-train-nodes: 2, but the fleet (one.toml) has 1 node" in err


class _Grid:
    """A SuperLink where only ``n`` nodes ever connect."""

    def __init__(self, n: int) -> None:
        self.ids = list(range(1, n + 1))

    def get_node_ids(self) -> list[int]:
        return list(self.ids)


def _fleet(min_nodes: int) -> Fleet:
    return Fleet({"model": "cnn", "batch-sizes": [32]}, [32], [1.0], min_nodes)


def test_the_wait_for_nodes_has_a_deadline_and_says_what_it_waits_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="strategies.fleet")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        _fleet(3).query(_Grid(1), timeout_s=1.0)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 5
    assert str(err.value).startswith(
        "min-train-nodes: 1 of the 3 nodes it needs connected within round-timeout-s (1 s)"
    )
    assert "waiting for nodes: 1 of the 3 that min-train-nodes needs" in caplog.text


def test_ctrl_c_ends_the_wait_for_nodes() -> None:
    # Python's own Ctrl-C handler, whatever an earlier test's library left installed
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _fleet(3).query(_Grid(1), timeout_s=30.0)  # type: ignore[arg-type]
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - t0 < 5


# ----------------------------------------------------------------------- §3: signals


def test_interrupt_handlers_respect_ignored_signals() -> None:
    # a test run started in the background has SIGINT ignored: start from Python's default
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with run.interruptible():
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGINT) is run._on_stop_signal
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def test_a_signal_becomes_run_interrupted_with_the_shells_exit_code() -> None:
    with pytest.raises(run.RunInterrupted) as err, run.interruptible():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert (err.value.name, err.value.exit_code) == ("SIGTERM", 143)
    assert run.RunInterrupted(signal.SIGINT).exit_code == 130
    assert isinstance(err.value, KeyboardInterrupt)  # Flower's `except Exception` lets it by


def test_the_interrupt_line_says_what_stopped_where_its_records_are_and_what_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = argparse.Namespace(command="simulate")
    intr = run.RunInterrupted(signal.SIGINT)
    monkeypatch.setattr(cli, "_progress", None)
    assert cli.interrupted_line(intr, args) == (
        "powerfl simulate: interrupted by SIGINT before a run started; no records"
    )
    progress = cli.SimulateProgress(["power-aware", "b1"], tmp_path, tmp_path / "cache")
    monkeypatch.setattr(cli, "_progress", progress)
    progress.start("power-aware")
    (tmp_path / "20260101-000000-power-aware").mkdir()
    progress.finish(str(tmp_path / "20260101-000000-power-aware"))
    progress.start("b1")
    assert "during b1 (method 2 of 2); it had written no records yet; power-aware finished: " in (
        cli.interrupted_line(intr, args)
    )
    (tmp_path / "20260101-000100-b1").mkdir()
    assert cli.interrupted_line(intr, args) == (
        f"powerfl simulate: interrupted by SIGINT during b1 (method 2 of 2); its finished "
        f"rounds are in {tmp_path / '20260101-000100-b1'} (no summary.json); power-aware "
        f"finished: {tmp_path / '20260101-000000-power-aware'}; a simulation does not resume "
        f"mid-run: run the same command again, it reuses the LUTs and r cached in "
        f"{tmp_path / 'cache'}"
    )
    progress.finish(str(tmp_path / "20260101-000100-b1"))
    assert cli.interrupted_line(intr, args).startswith(
        "powerfl simulate: interrupted by SIGINT after 2 of 2 methods; power-aware finished: "
    )


TREE = """
import subprocess, sys, time
grandchild = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', %r]); time.sleep(60)"
    % grandchild])
time.sleep(1.5)
from simulations.run import descendants, kill_descendants
pids = sorted(descendants())
print(" ".join(map(str, pids)), flush=True)
kill_descendants(grace_s=0.5)
"""


def test_kill_descendants_ends_the_whole_tree_even_what_ignores_sigterm(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", TREE], env=_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2  # the child and its grandchild (which ignores SIGTERM)
    time.sleep(0.2)
    assert not [p for p in pids if psutil.pid_exists(p) and _alive(p)]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(proc: subprocess.Popen[str], path_glob: str, root: Path, timeout_s: float) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(root.glob(path_glob)) if root.exists() else []
        if found:
            return found[0]
        if proc.poll() is not None:
            pytest.fail(f"exited early ({proc.returncode}): {proc.communicate()[1][-3000:]}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"{path_glob} did not appear in {timeout_s} s: {proc.communicate()[1][-3000:]}")


def _no_constant(name: str) -> None:
    pytest.fail(f"a {name} literal in the records: not standard JSON")


def _records_are_valid(run_dir: Path) -> None:
    """Every record parses as standard JSON (no NaN/Infinity), no half-written file left."""
    for path in run_dir.iterdir():
        text = path.read_text() if path.suffix in (".json", ".jsonl") else ""
        rows = text.splitlines() if path.suffix == ".jsonl" else [text] if text else []
        for row in rows:
            json.loads(row, parse_constant=_no_constant)
    assert not list(run_dir.glob("*.tmp"))


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_simulate_in_one_line_with_no_process_left(
    tmp_path: Path, signum: int, code: int
) -> None:
    """Sent by PID while the engine runs (Ray's processes up, the ServerApp at work)."""
    (tmp_path / "two.toml").write_text(TWO)
    proc = _powerfl(
        tmp_path, "simulate", "--methods", "b1,power-aware", "--fleet", "two.toml",
        "--output-dir", "runs", "-c", "cache-dir='cache'", "-c", "local-epochs=1",
        "-c", "batch-sizes='32,64'", "-c", "proxy-target-accuracy=0.3",
        "-c", "target-accuracy=0.99", "--rounds", "50",
    )  # fmt: skip
    settings = _wait_for(proc, "runs/*-b1/settings.json", tmp_path, timeout_s=240)
    engine = psutil.Process(proc.pid).children(recursive=True)
    assert engine, "the engine's processes should be running"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    lines = [ln for ln in err.splitlines() if "interrupted" in ln]
    name = signal.Signals(signum).name
    run_dir = settings.parent
    assert lines == [
        f"powerfl simulate: interrupted by {name} during b1 (method 1 of 2); its finished "
        f"rounds are in {run_dir} (no summary.json); a simulation does not resume mid-run: "
        f"run the same command again, it reuses the LUTs and r cached in {tmp_path / 'cache'}"
    ]
    assert err.rstrip().endswith(lines[0])  # the last word is ours, no traceback after it
    assert "Traceback" not in err
    time.sleep(0.5)
    assert not [p.pid for p in engine if _alive(p.pid)]
    _records_are_valid(run_dir)
    assert not (run_dir / "summary.json").exists()


@pytest.mark.slow
def test_sigterm_ends_experiment_run_in_one_line(tmp_path: Path) -> None:
    study = REPO_ROOT / "configs" / "experiments" / "single-device.toml"
    proc = _powerfl(tmp_path, "experiment", "run", str(study), "--out", "exp", "--no-progress")
    manifest = _wait_for(proc, "exp/manifest.json", tmp_path, timeout_s=240)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert err.strip().splitlines()[-1] == (
        f"powerfl experiment run: interrupted by SIGTERM; finished cells are kept in "
        f"{tmp_path / 'exp'}; run the same command again to resume from them"
    )
    assert "Traceback" not in err
    assert json.loads(manifest.read_text())["complete"] is False
    assert not [p.pid for p in children if _alive(p.pid)]


# ---------------------------------------------------------- §4: failures reach the user

GHOST = (
    TWO + '\n[[node]]\nname = "ghost"\ndevice = "jetson-nano"\nbackend = "replay"\n'
    'replay-table = "no-such-table.json"\np-max-w = 4.5\n'
)


def _summary(method: str, run_dir: Path, untrained: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "method": method,
        "run-dir": str(run_dir),
        "nodes": {"a": {"rounds-ok": 2}, "b": {"rounds-ok": 2}},
        "untrained-nodes": untrained,
    }


GHOST_RECORD = {
    "node": "ghost",
    "node-id": "17",
    "device": "jetson-nano",
    "p-max-w": 4.5,
    "cap-label": "4.5 W",
    "stage": "query",
    "rounds-failed": 0,
    "reason": "ReplayFormatError: replay-table: file not found: no-such-table.json",
}


@pytest.mark.parametrize("allow", [False, True])
def test_a_node_that_never_trained_fails_the_run_unless_allowed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    allow: bool,
) -> None:
    (tmp_path / "two.toml").write_text(TWO)
    monkeypatch.setattr(
        cli,
        "simulate",
        lambda overrides, **_: _summary(overrides["method"], tmp_path, [GHOST_RECORD]),
    )
    argv = ["simulate", "--methods", "b1", "--fleet", str(tmp_path / "two.toml")]
    argv += ["--output-dir", str(tmp_path / "runs")]
    rc = main([*argv, "-c", "allow-untrained-nodes=true"] if allow else argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    why = (
        "1 node never trained: ghost in b1 (QUERY failed: ReplayFormatError: replay-table: "
        "file not found: no-such-table.json)"
    )
    if allow:
        assert (rc, last) == (0, f"powerfl: warning: {why} (allowed by allow-untrained-nodes)")
    else:
        assert (rc, last) == (
            1,
            f"powerfl: error: {why}; the run's summary.json lists them under untrained-nodes; "
            "-c allow-untrained-nodes=true accepts such a run",
        )


def test_the_untrained_line_names_each_node_once_with_its_methods() -> None:
    train_failed = {
        "node": "c",
        "stage": "train",
        "rounds-failed": 3,
        "reason": "SettingsError: no cell under the cap",
    }
    unnamed = {"node": None, "node-id": "9", "one-of": ["x", "y"], "stage": "query"}
    summaries = [
        _summary("power-aware", Path("r1"), [GHOST_RECORD, train_failed]),
        _summary("b1", Path("r2"), [GHOST_RECORD, {**unnamed, "reason": "timeout"}]),
    ]
    assert cli.untrained_line(summaries) == (
        "3 nodes never trained: ghost in power-aware, b1 (QUERY failed: ReplayFormatError: "
        "replay-table: file not found: no-such-table.json); c in power-aware (every TRAIN "
        "failed: SettingsError: no cell under the cap); node 9 (one of x, y) in b1 (QUERY "
        "failed: timeout)"
    )
    assert cli.untrained_line([_summary("b1", Path("r"), [])]) is None


def test_a_node_whose_replay_table_is_missing_is_refused_before_start(tmp_path: Path) -> None:
    """One node of three names a replay table that does not exist: the pre-start check reads
    every node's table, so the run is refused (exit 2) before any engine starts, naming the
    node and the file; nothing is written."""
    (tmp_path / "ghost.toml").write_text(GHOST)
    out = subprocess.run(
        [sys.executable, "-c", CLI, "simulate", "--methods", "b1", "--fleet", "ghost.toml",
         "--output-dir", "runs", "--rounds", "1", "-c", "cache-dir='cache'",
         "-c", "batch-sizes='32,64'", "-c", "proxy-target-accuracy=0.3"],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    missing = tmp_path / "no-such-table.json"  # relative to the fleet file's folder
    assert out.stderr.strip().splitlines()[-1] == (
        f"powerfl: error: replay-table: node ghost: replay-table: file not found: {missing}"
    )
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


# -------------------------------------------------------------- §7: small and visible


def test_every_path_setting_is_relative_to_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.toml").write_text(ONE)
    typed = run.with_app_paths(
        {"fleet": "f.toml", "output-dir": "out", "cache-dir": "~/c", "dataset": "d/x.npz"}
    )
    assert typed["fleet"] == str(tmp_path / "f.toml")
    assert typed["output-dir"] == str(tmp_path / "out")
    assert typed["cache-dir"] == str(Path.home() / "c")
    assert typed["dataset"] == str(tmp_path / "d" / "x.npz")  # a path, whoever reads it
    defaults = run.with_app_paths({})  # what nobody typed: here too, the fleet shipped
    assert defaults["fleet"] == str(shipped_dir("fleets") / "default.toml")
    assert defaults["output-dir"] == str(tmp_path / "runs")
    assert defaults["cache-dir"] == str(tmp_path / ".powerfl-cache")
    assert run.with_app_paths({"dataset": "digits"})["dataset"] == "digits"  # a name


def test_a_relative_fleet_is_read_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one.toml").write_text(ONE)
    assert main(["simulate", "--fleet", "one.toml", "--output-dir", "runs"]) == 2
    assert "(one.toml) has 1 node" in capsys.readouterr().err  # found here, not in the repo


def test_flwr_home_is_relative_to_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLWR_HOME", "home")
    run.flower_env()
    assert os.environ["FLWR_HOME"] == str(tmp_path / "home")
    monkeypatch.delenv("FLWR_HOME")
    run.flower_env()
    assert os.environ["FLWR_HOME"] == str(tmp_path / ".flwr")  # the default: here too


def test_a_bad_command_fails_without_importing_torch_or_flower(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "t0 = time.perf_counter()\n"
        "from simulations.cli import main\n"
        "rc = main(['simulate', '-c', 'frobnicate=1'])\n"
        "print(rc, sorted(m for m in ('torch', 'flwr', 'ray') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "2 []", out.stderr
    assert "unknown key 'frobnicate'" in out.stderr


def test_a_method_that_cannot_serve_a_node_exits_2_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.toml").write_text(
        '[[node]]\nname = "nano"\ndevice = "jetson-nano"\np-max-w = 5\n'
        '[[node]]\nname = "orin-6w"\ndevice = "jetson-orin-nano"\np-max-w = 6.0\n'
    )
    rc = main(["simulate", "--fleet", "f.toml", "--methods", "power-aware,b1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "method: b1 cannot serve 1 node(s): orin-6w (jetson-orin-nano, cap 6 W" in err
    assert not (tmp_path / "runs").exists()  # power-aware did not run first


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-c", "classes-per-node=3"], "classes-per-node: only partitioning = 'pathological'"),
        (["-c", "partitioning=iid", "-c", "dirichlet-alpha=0.1"], "dirichlet-alpha: only"),
        (
            ["--methods", "fixed", "-c", "fixed-batch-size=abc", "-c", "fixed-freq-mhz=460.8"],
            "fixed-batch-size: expected a batch size ≥ 1",
        ),
        (
            ["--methods", "fixed", "-c", "fixed-batch-size=8", "-c", "fixed-freq-mhz=fast"],
            "fixed-freq-mhz: expected a GPU frequency in MHz > 0",
        ),
    ],
)
def test_typed_settings_nothing_would_read_or_of_the_wrong_type_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", *args]) == 2
    assert needle in capsys.readouterr().err


def test_a_dataset_folder_with_no_images_is_named_before_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "empty").mkdir(parents=True)
    (tmp_path / "data" / "notes").mkdir()
    (tmp_path / "data" / "notes" / "README.md").write_text("no images here")
    for folder, found in (("empty", "no files"), ("notes", "1 other file(s)")):
        rc = main(["simulate", "--methods", "b1", "-c", f"dataset=data/{folder}"])
        err = capsys.readouterr().err
        assert rc == 2
        assert f"dataset: the folder {tmp_path / 'data' / folder} holds no images and no " in err
        assert f"({found}); give a folder of images in one subfolder per class" in err
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------- r estimation: before any engine starts


def test_a_proxy_target_r_max_samples_cannot_reach_exits_2_before_any_engine(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    engine_starts: list[str],
) -> None:
    """It used to end the run inside the engine: a server traceback, Flower's exit code
    700, and the wrong key (``max-samples``) in the message."""
    monkeypatch.chdir(tmp_path)
    rc = main(
        ["simulate", "--methods", "power-aware", "-c", "batch-sizes='32,64'",
         "-c", "r-max-samples=256", "-c", "r-eval-every-samples=128",
         "-c", "proxy-target-accuracy=0.99"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(
        "powerfl: error: r-max-samples: no batch size of 32,64 reached proxy-target-accuracy "
        "0.99 on the proxy set within r-max-samples 256 samples (best proxy accuracy 0."
    )
    assert "raise r-max-samples (e.g. -c r-max-samples=1024), lower proxy-target-accuracy" in err
    assert "Traceback" not in err
    assert engine_starts == [] and not (tmp_path / "runs").exists()


def test_r_max_samples_below_one_evaluation_period_is_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "-c", "r-max-samples=100"]) == 2
    assert capsys.readouterr().err.startswith(
        "powerfl: error: r-max-samples: 100 is below r-eval-every-samples (256)"
    )


def test_the_server_reads_the_r_estimated_before_start_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One round-0 model recipe (``round0_model``): the server's estimate is a cache hit
    of the one made before start, never a second estimation."""
    from fl_client import r_estimation
    from fl_client.settings import RunSettings

    settings = RunSettings.from_config(
        {"cache-dir": str(tmp_path / "cache"), "batch-sizes": "32,64",
         "proxy-target-accuracy": 0.3, "r-eval-every-samples": 128}
    )  # fmt: skip
    run.estimate_r_before_start(settings)
    assert len(list((tmp_path / "cache" / "r").glob("r-*.json"))) == 1

    def never(*args: Any, **kw: Any) -> None:
        pytest.fail("the server estimated r again instead of reading the cache")

    monkeypatch.setattr(r_estimation, "_compute", never)
    model, weights = r_estimation.round0_model(settings)
    assert weights is None
    est = r_estimation.estimate_run_r(settings, model.state_dict(), progress=False)
    assert est.batch_sizes and len(est.r) == len(est.batch_sizes)


# ------------------------------------------- signals at other moments of a run (issue 25)

SIGNAL_AT = """
import os, signal, sys
from simulations import cli
{patch}
sys.exit(cli.main(sys.argv[1:]))
"""
#: SIGTERM sent from inside the pre-start checks.
DURING_CHECKS = """
real = cli.preflight
def preflight(overrides):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(overrides)
cli.preflight = preflight
"""
#: SIGINT sent from inside r estimation (before any engine: ``estimate_r_before_start``),
#: as its second (seed, batch size) run starts.
DURING_R = """
from fl_client import r_estimation
real = r_estimation.samples_to_target
calls = []
def samples_to_target(*args, **kw):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kw)
r_estimation.samples_to_target = samples_to_target
"""


def _signalled(tmp_path: Path, patch: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SIGNAL_AT.format(patch=patch), *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path),
        timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_a_signal_during_the_pre_start_checks_ends_in_one_line_with_nothing_written(
    tmp_path: Path,
) -> None:
    done = _signalled(tmp_path, DURING_CHECKS, "simulate", "--methods", "b1")
    assert done.returncode == 143, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "powerfl simulate: interrupted by SIGTERM before a run started; no records"
    )
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no runs/, no cache


def test_a_signal_during_r_estimation_keeps_the_cache_whole_and_names_what_next(
    tmp_path: Path,
) -> None:
    done = _signalled(
        tmp_path, DURING_R, "simulate", "--methods", "power-aware", "--output-dir", "runs",
        "-c", "cache-dir='cache'", "-c", "batch-sizes='32,64'",
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "powerfl simulate: interrupted by SIGINT during power-aware (method 1 of 1); it had "
        "written no records yet; a simulation does not resume mid-run: run the same command "
        f"again, it reuses the LUTs and r cached in {tmp_path / 'cache'}"
    )
    assert "Traceback" not in done.stderr
    r_cache = tmp_path / "cache" / "r"
    assert not r_cache.exists() or list(r_cache.iterdir()) == []  # no half estimate
    assert not (tmp_path / "runs").exists()


def test_a_signal_while_a_record_is_written_leaves_the_old_file_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records are written through a temporary file and a rename (``write_atomic``): an
    interruption in the middle leaves the file as it was, and no temporary file."""
    from fl_client import files

    target = tmp_path / "summary.json"
    target.write_text('{"round": 1}')

    def interrupted(fd: int) -> None:
        raise run.RunInterrupted(signal.SIGTERM)

    monkeypatch.setattr(files.os, "fsync", interrupted)
    with pytest.raises(run.RunInterrupted):
        files.write_atomic(target, '{"round": 2}')
    assert json.loads(target.read_text()) == {"round": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


# ------------------------- signals right after the data split, and during clean-up (issue 31)

#: The data split and r estimation made instant (their interruption is tested above): the
#: run reaches the engine's start at once.
QUICK_START = """
from simulations import run as _run, runtime as _runtime
class _Split:
    def lines(self, most): return ["data split (stand-in)"]
    def save(self, folder): pass
_run.check_partitions = lambda *args, **kw: _Split()
_run.estimate_r_before_start = lambda settings: None
def _signal(where):
    print(f"test: SIGINT {where}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGINT)
"""
#: SIGINT while ``fl_server.results`` is being imported (it is in ``sys.modules`` without
#: its ``RUN_STOPPED`` yet), as the engine's start first imports it.
DURING_RESULTS_IMPORT = """
import importlib.abc, importlib.machinery
class _SignalOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "fl_server.results":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        real = spec.loader.exec_module
        def exec_module(module):
            _signal("while fl_server.results is imported")
            real(module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, _SignalOnImport())
"""
#: SIGINT as soon as the run's folder and the staged app's private folder exist.
AFTER_RUN_FOLDER = """
_claim = _runtime._claim_output
def _claim_output(*args, **kw):
    out = _claim(*args, **kw)
    _signal("after the run folder was made")
    return out
_runtime._claim_output = _claim_output
"""
#: A second SIGINT while the first one's clean-up runs (a user pressing Ctrl-C twice).
TWICE = """
def _stop_engine(*args, **kw):
    _signal("again during the clean-up")
    time.sleep(30)
cli.stop_engine = _stop_engine
"""


def _simulate_signalled(tmp_path: Path, *patches: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "two.toml").write_text(TWO)
    (tmp_path / "tmp").mkdir()
    argv = ["simulate", "--methods", "b1", "--fleet", "two.toml", "--output-dir", "runs"]
    return subprocess.run(
        [sys.executable, "-c", SIGNAL_AT.format(patch="import time\n" + "\n".join(patches)),
         *argv, "-c", "cache-dir='cache'"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**_env(tmp_path), "TMPDIR": str(tmp_path / "tmp")},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def _no_run_started_line(tmp_path: Path) -> str:
    return (
        "powerfl simulate: interrupted by SIGINT during b1 (method 1 of 1); it had written no "
        "records yet; a simulation does not resume mid-run: run the same command again, it "
        f"reuses the LUTs and r cached in {tmp_path / 'cache'}"
    )


@pytest.mark.parametrize("moment", [DURING_RESULTS_IMPORT, AFTER_RUN_FOLDER])
def test_ctrl_c_right_after_the_data_split_ends_in_one_line_and_leaves_no_folder(
    tmp_path: Path, moment: str
) -> None:
    done = _simulate_signalled(tmp_path, QUICK_START, moment)
    assert "test: SIGINT" in done.stderr  # the signal came at that moment
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == _no_run_started_line(tmp_path)
    assert [ln for ln in lines if "interrupted" in ln] == lines[-1:]
    _nothing_left(tmp_path)


def _nothing_left(tmp_path: Path) -> None:
    assert list((tmp_path / "tmp").iterdir()) == []  # no staged app left
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []  # no empty run folder


def test_a_second_ctrl_c_during_the_clean_up_still_says_what_stopped(tmp_path: Path) -> None:
    """It ends the process at once (the clean-up cut short), with the same one line."""
    done = _simulate_signalled(tmp_path, QUICK_START, AFTER_RUN_FOLDER, TWICE)
    assert "test: SIGINT again during the clean-up" in done.stderr
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == _no_run_started_line(tmp_path)
    assert [ln for ln in lines if "interrupted" in ln] == lines[-1:]
    _nothing_left(tmp_path)
