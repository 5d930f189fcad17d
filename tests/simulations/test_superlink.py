"""The run's own SuperLink and the ``flwr`` commands (``simulations.superlink``): the
environment every process of the run gets, the relay of ``flwr run --stream``'s log, and
stopping a process tree by PID, orphans included. Every process is started here and
stopped by PID."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from simulations.processes import process_tree
from simulations.superlink import LocalSuperLink, RunStream, runtime_env, stop_tree


def test_environment_keeps_ray_private_unless_given_a_cluster(tmp_path: Path) -> None:
    env = runtime_env(tmp_path / "home", None)
    assert env["RAY_ADDRESS"] == "local"  # never a cluster found on the host
    assert env["FLWR_HOME"] == str(tmp_path / "home")
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert env["FLWR_TELEMETRY_ENABLED"] == "0"
    assert runtime_env(tmp_path, "10.0.0.5:6379")["RAY_ADDRESS"] == "10.0.0.5:6379"


def test_stream_takes_the_run_id_and_relays_the_log_without_flowers_notes(
    tmp_path: Path,
) -> None:
    lines = [
        "\x1b[32mSuccessfully started run 1234\x1b[0m",
        "\x1b[92mINFO \x1b[0m:      Starting logstream for run_id `1234`",
        "\x1b[92mINFO \x1b[0m:      Starting Flower Simulation",
        "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10",
        "Successfully installed powerfl to /tmp/x/apps/powerfl.powerfl.0.1.0.abc.",
        "powerfl method=power-aware model=cnn rounds≤1",
        "round   1  accuracy 0.187",
        "\x1b[92mINFO \x1b[0m:      ",
    ]
    script = "import sys\nfor line in sys.argv[1:]: print(line)\n"
    link = LocalSuperLink(tmp_path, env=dict(os.environ))
    out = io.StringIO()
    stream = RunStream([sys.executable, "-c", script, *lines], link, out, tmp_path / "log", True)
    assert stream.wait_started(30) == 1234
    assert stream.wait(30)
    assert (
        out.getvalue()
        == "powerfl method=power-aware model=cnn rounds≤1\nround   1  accuracy 0.187\n"
    )
    assert stream.tail_text().endswith("round   1  accuracy 0.187")
    assert "Starting Flower Simulation" in (tmp_path / "log").read_text()  # all kept there


def test_a_failed_flwr_run_gives_no_run_id(tmp_path: Path) -> None:
    link = LocalSuperLink(tmp_path, env=dict(os.environ))
    argv = [sys.executable, "-c", "import sys; print('Error: no SuperLink'); sys.exit(1)"]
    stream = RunStream(argv, link, None, tmp_path / "log", False)
    assert stream.wait_started(30) is None
    assert "no SuperLink" in stream.tail_text()


def test_stop_tree_ends_every_process_below_one_also_orphans(tmp_path: Path) -> None:
    """A parent whose children outlive it (as SuperExec's and Ray's do)."""
    script = textwrap.dedent(
        """
        import subprocess, sys, time
        for _ in range(2):
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        print("ready", flush=True)
        time.sleep(120)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    tree = process_tree(proc.pid)
    assert len(tree) == 3
    stop_tree(proc, grace_s=3.0)
    assert proc.poll() is not None
    assert not [p for p in tree if Path(f"/proc/{p}").exists() and _state(p) != "Z"]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
