"""`powerfl simulate` refuses bad input before any engine starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from simulations.cli import any_node_trained, main


def _fleet(path: Path, n: int) -> Path:
    path.write_text(
        "".join(
            f'[[node]]\nname = "n{i}"\ndevice = "jetson-nano"\np-max-w = 5\n\n' for i in range(n)
        )
    )
    return path


def test_a_fleet_too_large_for_the_data_is_refused_before_training(tmp_path, capsys):
    fleet = _fleet(tmp_path / "fleet.toml", 150)
    rc = main(["simulate", "--fleet", str(fleet), "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "fleet: the 1047 training images of digits cannot be split over 150 nodes" in err
    assert "need 1500 samples, only 1047 available" in err
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--methods", "power-aware,fastest"], "method: unknown value 'fastest'"),
        (["-c", "batch-sizes='8,4'"], "batch-sizes"),
        (["--fleet", "no/such/fleet.toml"], "fleet: fleet file not found"),
        (["--model", "vgg"], "model: unknown value 'vgg'"),
        (["-c", "dataset='no/such/data.npz'"], "dataset"),
        (["-c", "dataset=''"], "dataset: must be a dataset name"),
        (["-c", "partitioning='shards'"], "partitioning: unknown value 'shards'"),
        (
            ["-c", "partitioning='pathological'", "-c", "classes-per-node=11"],
            "classes-per-node",
        ),
        (["-c", "lr-ref=inf"], "lr-ref: must be a finite number > 0.0, got inf"),
        (["-c", "lr-ref=nan"], "lr-ref: must be a finite number > 0.0, got nan"),
        # settings that would take no effect in this run (fl_client.effective)
        (["-c", "straggler-work=0.5"], "straggler-work: 0.5 would take no effect"),
        (["-c", "round-deadline-s=60"], "round-deadline-s: 60.0 would take no effect"),
        (["-c", "critical-r-weight=0.5"], "critical-r-weight: 0.5 would take no effect"),
        (["-c", "deadline-margin=0.2"], 'balance = "off" plans no round'),
        (
            ["--methods", "b1", "-c", "balance='steps'"],
            "balance: 'steps' would take no effect: only power-aware and oracle plan a round",
        ),
    ],
)
def test_bad_settings_name_the_key(tmp_path, capsys, args, message):
    rc = main(["simulate", "--output-dir", str(tmp_path / "runs"), *args])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_a_run_where_no_node_trained_counts_as_failed():
    assert not any_node_trained({"nodes": {"a": {"rounds-ok": 0, "rounds-failed": 3}}})
    assert not any_node_trained({"nodes": {}})
    assert any_node_trained({"nodes": {"a": {"rounds-ok": 0}, "b": {"rounds-ok": 1}}})


def test_the_split_is_shown_per_node_before_the_engine_starts(tmp_path):
    from fl_client.settings import RunSettings
    from simulations.run import check_partitions

    settings = RunSettings.from_config({"partitioning": "iid"})
    split = check_partitions(settings, 3, ["a", "b", "c"])
    lines = split.lines()
    assert lines[0].startswith("data split of digits over 3 nodes: iid")
    assert [line.split()[0] for line in lines[1:]] == ["a", "b", "c"]
    assert sum(split.sizes()) <= 1047
    short = check_partitions(settings, 40, [f"n{i}" for i in range(40)]).lines(most=5)
    assert len(short) == 7 and "and 35 more nodes" in short[-1]
    assert [p.name for p in split.save(tmp_path)] == ["split.json", "split.png"]


# ------------------------------------------------------------- engines: --engine, Ray, shares


def _simulate_args(*args: str):
    from simulations.cli import build_parser

    argv = ["simulate", *args]
    return build_parser(argv).parse_args(argv)


def test_the_engine_defaults_to_flowers_simulation_runtime(monkeypatch):
    """Flower's supported path where the installed Flower has it (the pinned 1.41), else
    (flwr 1.30 on a Jetson's Python 3.10) the in-process engine."""
    from simulations import runtime
    from simulations.cli import choose_engine

    args = _simulate_args()
    assert (args.engine, args.ray_address, args.num_cpus, args.num_gpus) == (None, None, 1.0, 0.0)
    assert runtime.flower_version() >= runtime.MIN_FLOWER  # constraints.txt pins flwr 1.41
    assert choose_engine(args) == "runtime"
    monkeypatch.setattr(runtime.importlib.metadata, "version", lambda name: "1.30.0")
    assert choose_engine(args) == "in-process"
    assert choose_engine(_simulate_args("--ray-address", "head.lab:6380")) == "runtime"


@pytest.mark.parametrize(
    ("flags", "engine", "address", "cpus", "gpus"),
    [
        (["--engine", "runtime"], "runtime", None, 1.0, 0.0),
        (["--engine", "in-process", "--num-cpus", "0.5"], "in-process", None, 0.5, 0.0),
        (["--ray-address", "127.0.0.1:6379"], "runtime", "127.0.0.1:6379", 1.0, 0.0),
        (
            ["--engine", "runtime", "--ray-address", "head.lab:6380", "--num-cpus", "2"],
            "runtime",
            "head.lab:6380",
            2.0,
            0.0,
        ),
        (["--engine=runtime", "--num-gpus", "0.25"], "runtime", None, 1.0, 0.25),
    ],
)
def test_the_engine_flags_parse(flags, engine, address, cpus, gpus):
    from simulations.cli import choose_engine

    args = _simulate_args(*flags)
    assert choose_engine(args) == engine  # --ray-address implies the runtime
    assert (args.ray_address, args.num_cpus, args.num_gpus) == (address, cpus, gpus)


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        (["--engine", "flwr"], "--engine"),
        (["--ray-address", "6379"], "--ray-address"),
        (["--ray-address", "127.0.0.1:"], "--ray-address"),
        (["--ray-address", "127.0.0.1:70000"], "--ray-address"),
        (["--num-cpus", "0"], "--num-cpus"),
        (["--num-cpus", "-1"], "--num-cpus"),
        (["--num-cpus", "nan"], "--num-cpus"),
        (["--num-cpus", "two"], "--num-cpus"),
        (["--num-gpus", "-0.5"], "--num-gpus"),
        (["--num-gpus", "inf"], "--num-gpus"),
    ],
)
def test_bad_engine_flags_exit_2_naming_the_flag(capsys, flags, flag):
    with pytest.raises(SystemExit) as info:
        main(["simulate", *flags])
    assert info.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--engine", "in-process", "--ray-address", "127.0.0.1:6379"],
            "--ray-address: a Ray cluster is joined through Flower's Simulation Runtime",
        ),
        (
            ["--ray-address", "127.0.0.1:6379", "--num-cpus", "0.5"],
            "--num-cpus: 0.5 per node on an existing Ray cluster",
        ),
        (
            ["--engine", "runtime", "--methods", "power-aware,b1", "-c", "run-dir='one'"],
            "run-dir: names one run's folder, and this command runs 2 methods",
        ),
    ],
)
def test_engine_settings_that_cannot_run_are_refused_before_any_run(
    tmp_path, capsys, flags, message
):
    rc = main(["simulate", "--output-dir", str(tmp_path / "runs"), *flags])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing started


def test_a_run_dir_that_holds_a_finished_run_is_refused(tmp_path, capsys):
    done = tmp_path / "done"
    done.mkdir()
    (done / "summary.json").write_text("{}")
    rc = main(["simulate", "--methods", "b1", "-c", f"run-dir='{done}'"])
    assert rc == 2
    assert f"run-dir: {done} already holds another run's records (summary.json)" in (
        capsys.readouterr().err
    )


def test_a_run_dir_another_run_holds_or_wrote_rounds_into_is_refused(tmp_path, capsys, monkeypatch):
    """Two runs given one run-dir: the second is refused while the first runs (its lock)
    and after it wrote rounds (an interrupted run's folder), never mixed into one file."""
    import subprocess

    from fl_client.files import RUN_LOCK, claim_run_folder, release_run_folder

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "shared"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        folder.mkdir()
        (folder / RUN_LOCK).write_text(f"{other.pid} 2026-01-01T00:00:00\n")
        rc = main(["simulate", "--methods", "b1", "-c", f"run-dir='{folder}'", "--rounds", "1"])
        err = capsys.readouterr().err
        assert rc == 2
        assert f"run-dir: {folder} belongs to a run in progress (process {other.pid}" in err
    finally:
        other.kill()
        other.wait()
    claim_run_folder(folder)  # the lock of a process that is gone is taken over
    assert (folder / RUN_LOCK).read_text().split()[0] == str(os.getpid())
    release_run_folder(folder)
    assert not (folder / RUN_LOCK).exists()
    (folder / "rounds.jsonl").write_text('{"round": 1}\n')
    assert main(["simulate", "--methods", "b1", "-c", f"run-dir='{folder}'"]) == 2
    assert "already holds another run's records (rounds.jsonl)" in capsys.readouterr().err


def test_the_runtime_engine_refuses_an_old_flower_before_any_run(tmp_path, capsys, monkeypatch):
    from simulations import runtime

    monkeypatch.setattr(runtime.importlib.metadata, "version", lambda name: "1.30.0")
    rc = main(["simulate", "--engine", "runtime", "--output-dir", str(tmp_path / "runs")])
    assert rc == 2
    assert "flwr 1.30.0: the Simulation Runtime path needs flwr >= 1.41" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "runs").exists()


def test_simulate_refuses_an_unknown_engine_naming_the_flag():
    from fl_client.settings import SettingsError
    from simulations.run import simulate

    allowed = r"^--engine: unknown engine 'flwr'; allowed: runtime, in-process$"
    with pytest.raises(SettingsError, match=allowed):
        simulate({}, engine="flwr")


def test_the_runtime_engine_runs_through_run_in_runtime_and_keeps_the_split(
    tmp_path, capsys, monkeypatch
):
    """``simulate`` hands the run to ``run_in_runtime`` (a ``ray_address`` alone picks that
    engine) with the fleet's size and the per-node shares, and still prints the data split
    and saves it in the run's folder."""
    from fl_client.settings import load_fleet
    from simulations import runtime
    from simulations.run import simulate

    calls: dict[str, Any] = {}
    run_dir = tmp_path / "runs" / "20260101-000000-power-aware"

    def fake_run_in_runtime(overrides, options):
        calls.update(vars(options), overrides=overrides)
        run_dir.mkdir(parents=True)
        summary = {"method": "power-aware", "run-dir": str(run_dir)}
        return runtime.RuntimeResult(7, "finished:completed", run_dir, summary, 1.0)

    monkeypatch.setattr(runtime, "run_in_runtime", fake_run_in_runtime)
    overrides = {"output-dir": str(tmp_path / "runs"), "partitioning": "iid"}
    summary = simulate(
        overrides, num_cpus_per_node=2, num_gpus_per_node=0.5, ray_address="127.0.0.1:6379"
    )
    assert summary["run-dir"] == str(run_dir)
    assert calls["ray_address"] == "127.0.0.1:6379" and calls["backend"] == "ray"
    assert calls["resources"] == runtime.NodeResources(num_cpus=2, num_gpus=0.5)
    assert calls["num_nodes"] == len(load_fleet(calls["overrides"]["fleet"]))
    assert Path(calls["overrides"]["fleet"]).is_absolute()
    assert "data split of digits over" in capsys.readouterr().out
    assert (run_dir / "split.json").is_file()


def test_a_ray_address_with_nothing_listening_fails_in_seconds_naming_it(
    tmp_path, capsys, monkeypatch
):
    import socket
    import time

    monkeypatch.chdir(tmp_path)
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    rc = main(["simulate", "--methods", "b1", "--ray-address", f"127.0.0.1:{port}"])
    assert rc == 2
    assert time.monotonic() - t0 < 30  # it used to wait with no word past 240 s
    err = capsys.readouterr().err
    assert f"--ray-address: nothing answers at 127.0.0.1:{port} (" in err
    assert "ray start --head" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--fleet", "a.toml", "--fleet", "b.toml"], "--fleet: given twice (a.toml and b.toml)"),
        (["--rounds", "3", "--rounds", "5"], "--rounds: given twice (3 and 5)"),
        (["--methods", "b1", "--methods", "b2"], "--methods: given twice (b1 and b2)"),
        (["--output-dir", "x", "--output-dir", "y"], "--output-dir: given twice (x and y)"),
        (["--engine", "runtime", "--engine", "in-process"], "--engine: given twice"),
    ],
)
def test_an_option_given_twice_with_two_values_is_refused(argv, needle, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["simulate", *argv])
    assert stop.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["lut", "--library", "a", "--library", "b", "list"], "--library: given twice (a and b)"),
        (
            ["lut", "import", "f.json", "--device", "jetson-nano", "--device", "jetson-tx2-nx"],
            "--device: given twice (jetson-nano and jetson-tx2-nx)",
        ),
        (["pretrain", "--out", "a.st", "--out", "b.st"], "--out: given twice (a.st and b.st)"),
        (["profile", "--model", "cnn", "--model", "resnet18"], "--model: given twice"),
        (["select", "--lut", "a.json", "--lut", "b.json"], "--lut: given twice"),
        (
            ["experiment", "run", "single-device", "--out", "a", "--out", "b"],
            "--out: given twice (a and b)",
        ),
        (
            ["experiment", "run", "single-device", "--scale", "mini", "--scale", "paper"],
            "--scale: given twice (mini and paper)",
        ),
    ],
)
def test_every_command_refuses_an_option_given_twice(argv, needle, capsys):
    """One rule for all of powerfl's commands: an option that takes one value, given twice
    with two values, is an error naming it (argparse kept the last without a word)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert needle in capsys.readouterr().err


def test_the_same_value_twice_is_accepted_and_a_repeated_set_key_is_refused(tmp_path, capsys):
    from simulations.cli import build_parser

    args = build_parser(["lut"]).parse_args(["lut", "--library", "a", "--library", "a", "list"])
    assert args.library == "a"
    out = tmp_path / "exp"
    argv = ["experiment", "run", "single-device", "--out", str(out)]
    assert main([*argv, "--set", "seeds=1", "--set", "seeds=2"]) == 2
    err = capsys.readouterr().err
    assert "experiment: error: seeds: given twice (--set seeds=1, --set seeds=2); give it" in err
    assert not out.exists()


def test_path_settings_that_name_a_file_or_nowhere_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")
    assert main(["simulate", "--methods", "b1", "-c", "run-dir=a-file"]) == 2
    assert f"run-dir: {tmp_path / 'a-file'} is a file, not a folder" in capsys.readouterr().err
    monkeypatch.setenv("POWERFL_CONFIG_DIR", str(tmp_path / "nowhere"))
    assert main(["simulate", "--methods", "b1"]) == 2
    err = capsys.readouterr().err
    assert f"POWERFL_CONFIG_DIR: {tmp_path / 'nowhere'} does not exist" in err
    assert not (tmp_path / "runs").exists()
    (tmp_path / "empty").mkdir()  # a folder without the fleet's descriptors: at start too
    monkeypatch.setenv("POWERFL_CONFIG_DIR", str(tmp_path / "empty"))
    assert main(["simulate", "--methods", "b1"]) == 2
    err = capsys.readouterr().err
    assert "device: node nano-4.5w-1 (jetson-nano): no descriptor jetson-nano.toml in " in err
    assert f"{tmp_path / 'empty'} (no <kind>.toml at all)" in err and "POWERFL_CONFIG_DIR" in err
    assert not (tmp_path / "runs").exists()


def _summary(method: str, busy_j: float, idle_j: float, accounting: str) -> dict[str, Any]:
    """The keys of a run's summary.json that the comparison reads."""
    headline = busy_j + (idle_j if accounting == "on" else 0.0)
    return {
        "method": method,
        "final-accuracy": 0.86,
        "target-window": 3,
        "round-to-target": 10,
        "first-round-at-target": 8,
        "rounds": 10,
        "sim-time-to-target-s": 5.0 if method == "ours" else 6.0,
        "sim-time-s": 5.0,
        "idle-accounting": accounting,
        "fleet-energy-to-target-j": headline,
        "fleet-busy-energy-to-target-j": busy_j,
        "fleet-idle-energy-to-target-j": idle_j,
        "fleet-energy-j": headline,
        "profile-share": 0.1,
    }


@pytest.mark.parametrize("accounting", ["on", "off"])
def test_the_comparison_shows_energy_with_and_without_idle_waiting(capsys, accounting):
    from simulations.cli import print_comparison

    print_comparison(
        [_summary("ours", 80.0, 60.0, accounting), _summary("b1", 77.0, 77.0, accounting)]
    )
    out = capsys.readouterr().out
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│")}
    cells = [c.strip() for c in rows["ours"].split("│")]
    assert cells[3:5] == ["10", "8"]  # round→target (the window's), first round at target
    if accounting == "on":
        assert "idle-accounting = on" in out
        assert all(x in rows["ours"] for x in ("140.0", "80.0", "60.0"))
        assert f"{154 / 140:.2f}× less fleet energy to target" in out
        assert f"({77 / 80:.2f}× without idle waiting)" in out
    else:
        assert "idle-accounting = off" in out
        assert all(x in rows["ours"] for x in ("80.0", "60.0")) and "140.0" not in out
        assert f"{77 / 80:.2f}× less fleet energy to target" in out
        assert "without idle waiting" not in out


def test_a_setting_without_effect_is_named_once_per_command_not_again_by_each_server(
    tmp_path, capsys, monkeypatch
):
    """``--methods power-aware,b1 -c balance=samples``: b1 plans no round. The command names
    it once before its runs; each run's server (here the real ``settings_notes``, as
    ``run_server`` prints them, in the environment the run inherits) does not again."""
    from fl_client.effective import named_by_caller_already
    from fl_client.settings import RunSettings
    from fl_server.server_app import settings_notes
    from simulations import cli
    from simulations.runtime import RuntimeRunError

    servers: list[str] = []

    def fake_simulate(overrides, **kwargs):
        servers.append(overrides["method"])
        settings = RunSettings.from_config(overrides)
        for note in settings_notes(settings, overrides):
            print(f"settings: {note}", file=sys.stderr)
        if len(servers) == 2:
            raise RuntimeRunError("stopped here: the notes are what this test reads")
        return {"method": overrides["method"], "run-dir": str(tmp_path)}

    monkeypatch.setattr(cli, "simulate", fake_simulate)
    monkeypatch.setattr(cli, "check_runtime", lambda args, n: None)
    argv = ["simulate", "--methods", "power-aware,b1", "-c", "balance=samples"]
    assert main([*argv, "--output-dir", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert servers == ["power-aware", "b1"]
    assert err.count("take no effect") == 1, err
    assert 'balance = "samples": b1 plans no round' in err
    assert not named_by_caller_already()  # the command's runs only: the process is as before
    # a server started without the command (a deployment) still names it
    b1 = RunSettings.from_config({"method": "b1", "balance": "samples"})
    assert any("take no effect" in n for n in settings_notes(b1, {"balance": "samples"}))
