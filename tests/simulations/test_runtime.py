"""Issue 14 §4: a simulation through Flower's Simulation Runtime (the path behind
``flwr run``), on a private Ray or across an existing Ray cluster.

Fast tests check what goes to Flower (federation config, staged app, environment, the log
relay, stopping a process tree) against Flower's own parsers. The slow ones run the app:
one run on a private Ray; a failed run and a run past its deadline (an error each, nothing
left behind); and a 3-node fleet across a two-node Ray cluster started here on loopback
(a head and a second node), with a ClientApp on each Ray node. Every process is started in
this file or by the runtime and stopped by PID.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fl_client.settings import REPO_ROOT, SettingsError
from simulations import runtime
from simulations.processes import process_tree
from simulations.runtime import (
    NodeResources,
    RuntimeOptions,
    federation_config,
    federation_config_arg,
    run_in_runtime,
    stage_app,
)
from simulations.superlink import STARTUP_TIMEOUT_S, LocalSuperLink, RuntimeRunError, stop_tree
from tests.simulations.test_superlink import _state

FLEET = textwrap.dedent(
    """
    [[node]]
    name = "nano-a"
    device = "jetson-nano"
    p-max-w = 7.0

    [[node]]
    name = "orin-b"
    device = "jetson-orin-nano"
    p-max-w = "none"

    [[node]]
    name = "tx2-c"
    device = "jetson-tx2-nx"
    p-max-w = 10.0
    """
)
#: Small settings: the runs are about the runtime, not the learning.
SMALL = {
    "aggregation": "fedavg",  # synchronous rounds: the tests count them
    "num-rounds": 1,
    "local-epochs": 1,
    "batch-sizes": "32,64",
    "proxy-target-accuracy": 0.3,
    "target-accuracy": 1.0,
    "partitioning": "iid",
}


def _fleet(tmp_path: Path, nodes: int) -> Path:
    path = tmp_path / f"fleet-{nodes}.toml"
    path.write_text("\n\n".join(FLEET.strip().split("\n\n")[:nodes]) + "\n")
    return path


def _own_processes() -> set[int]:
    """Live processes below this one (the runtime's must all be gone after a run)."""
    return set(process_tree(os.getpid())) - {os.getpid()}


# ----------------------------------------------------------------------------- fast


def test_federation_config_private_ray_whole_and_fractional_cpus() -> None:
    whole = federation_config(3, NodeResources(num_cpus=2, num_gpus=0.25), cpu_count=8)
    assert whole["num-supernodes"] == 3 and whole["backend"] == "ray"
    assert whole["client-resources-num-cpus"] == 2 and whole["init-args-num-cpus"] == 8
    assert whole["client-resources-num-gpus"] == 0.25
    # Flower takes whole CPUs per node: half a CPU is 1 of twice as many logical CPUs
    half = federation_config(3, NodeResources(num_cpus=0.5), cpu_count=8)
    assert half["client-resources-num-cpus"] == 1 and half["init-args-num-cpus"] == 16
    assert "init-args-num-gpus" not in half  # Ray finds the GPUs itself


def test_federation_config_on_a_cluster_gives_no_cpu_or_gpu_counts() -> None:
    cfg = federation_config(4, NodeResources(num_cpus=1, num_gpus=0.5), ray_address="h:6379")
    assert cfg["client-resources-num-cpus"] == 1 and cfg["client-resources-num-gpus"] == 0.5
    assert not any(k.startswith("init-args-num-") for k in cfg)
    with pytest.raises(SettingsError, match=r"num-cpus: 0\.5 per node on an existing Ray"):
        federation_config(4, NodeResources(num_cpus=0.5), ray_address="h:6379")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_cpus": 0}, "num-cpus"),
        ({"num_gpus": -1}, "num-gpus"),
        ({"num_cpus": float("nan")}, "num-cpus"),
    ],
)
def test_bad_resources_are_refused(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(SettingsError, match=match):
        NodeResources(**kwargs)


def test_federation_config_parses_as_flower_parses_it() -> None:
    """The string is what ``flwr run --federation-config`` turns into Flower's
    SimulationConfig (the same two functions ``flwr run`` calls)."""
    config = pytest.importorskip("flwr.common.config")
    utils = pytest.importorskip("flwr.supercore.utils")
    if not hasattr(utils, "simulation_config_from_json"):
        pytest.skip("this Flower has no SimulationConfig")
    fed = federation_config(5, NodeResources(num_cpus=0.5, num_gpus=0.125), cpu_count=2)
    parsed = config.parse_config_args([federation_config_arg(fed)])
    sim = utils.simulation_config_from_json({k.replace("-", "_"): v for k, v in parsed.items()})
    assert sim.num_supernodes == 5 and sim.backend == "ray"
    assert sim.client_resources_num_cpus == 1 and sim.init_args_num_cpus == 4
    assert sim.client_resources_num_gpus == 0.125
    assert sim.init_args_logging_level == "WARNING" and sim.init_args_log_to_driver


def test_staged_app_accepts_every_setting_the_run_overrides(tmp_path: Path) -> None:
    """Flower refuses a run-config key the app does not declare; the staged app declares
    every key the run gives (here one the app's pyproject.toml does not have)."""
    config = pytest.importorskip("flwr.common.config")
    run_config = {"num-rounds": 1, "x-undeclared": 32, "output-dir": str(tmp_path / "o")}
    app = stage_app(tmp_path / "app", run_config)
    parts = ("fl_client/client_app.py", "fl_server/server_app.py", "strategies")
    for part in (*parts, "configs/fleets/default.toml", "configs/devices/jetson-nano.toml"):
        assert (app / part).exists(), part
    assert not list(app.rglob("__pycache__"))
    text = (app / "pyproject.toml").read_text()
    assert "federations" not in text
    file = tmp_path / "run-config.toml"
    file.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in run_config.items()))
    fused = config.get_fused_config_from_dir(app, config.parse_config_args([str(file)]))
    assert fused["x-undeclared"] == 32 and fused["num-rounds"] == 1
    assert fused["method"] == "power-aware"  # the app's defaults stay
    # the repository's own pyproject.toml is untouched
    assert "x-undeclared" not in (REPO_ROOT / "pyproject.toml").read_text()


def test_an_old_flower_is_refused_before_anything_starts(tmp_path: Path) -> None:
    assert runtime.flower_version() >= runtime.MIN_FLOWER  # the one installed here
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime.importlib.metadata, "version", lambda name: "1.30.0")
        assert runtime.flower_version() == (1, 30, 0)
        with pytest.raises(SettingsError, match=r"flwr 1\.30\.0: the Simulation Runtime"):
            run_in_runtime({"output-dir": str(tmp_path / "runs")}, RuntimeOptions(workdir=tmp_path))
    assert not list(tmp_path.iterdir())


def test_paths_are_made_absolute_against_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = runtime.with_app_paths({"output-dir": "elsewhere"})
    assert out["output-dir"] == str(tmp_path / "elsewhere")
    assert out["fleet"] == str(REPO_ROOT / "configs/fleets/default.toml")


# ----------------------------------------------------------------------------- slow


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the module's runs: r on the proxy set is estimated once."""
    return tmp_path_factory.mktemp("runtime-cache")


def _settings(tmp_path: Path, cache_dir: Path, nodes: int, **more: Any) -> dict[str, Any]:
    return {
        **SMALL,
        "fleet": str(_fleet(tmp_path, nodes)),
        "cache-dir": str(cache_dir),
        "output-dir": str(tmp_path / "runs"),
        **more,
    }


@pytest.mark.slow
def test_a_run_through_the_runtime_returns_its_own_summary(tmp_path: Path, cache_dir: Path) -> None:
    before = _own_processes()
    out = io.StringIO()
    res = run_in_runtime(
        _settings(tmp_path, cache_dir, 2), RuntimeOptions(timeout_s=300, out=out, workdir=tmp_path)
    )
    assert res.status == "finished:completed" and res.run_id > 0
    assert res.summary["rounds"] == 1
    assert res.summary["run-dir"] == str(res.run_dir)
    assert {n: v["rounds-ok"] for n, v in res.summary["nodes"].items()} == {
        "nano-a": 1,
        "orin-b": 1,
    }
    if runtime.app_has_setting("run-dir"):  # the folder the runtime made and handed over
        assert res.run_dir.parent == tmp_path / "runs"
    else:  # the only folder in the run's own output folder
        assert res.run_dir.parent.parent == tmp_path / "runs"
        assert res.run_dir.parent.name.startswith("runtime-")
    assert res.run_dir.name.endswith("-power-aware")
    assert (res.run_dir / "rounds.jsonl").is_file()
    # the console shows the run as `powerfl simulate` does, without Flower's notes
    text = out.getvalue()
    for expected in ("powerfl method=power-aware", "fleet: 2 nodes answered", "round   1"):
        assert expected in text
    assert "Per node (power-aware)" in text and "results: " in text
    for absent in ("DEPRECATED", "Starting logstream", "simulated SuperNodes"):
        assert absent not in text
    # nothing left behind: no process, no private folder
    assert _own_processes() <= before
    assert not list(tmp_path.glob("powerfl-rt-*"))


@pytest.mark.slow
def test_a_failed_run_is_an_error_with_the_logs_tail(tmp_path: Path) -> None:
    """The ServerApp fails early (r estimation cannot reach its target within its sample
    budget, which ``powerfl simulate`` refuses before start, but ``flwr run`` does not
    check); ``flwr run`` would exit 0, the runtime reads Flower's status and raises with
    the tail of the run's log, and keeps the SuperLink's log."""
    before = _own_processes()
    failing = {"proxy-target-accuracy": 0.99, "r-max-samples": 256, "r-eval-every-samples": 128}
    with pytest.raises(RuntimeRunError) as info:
        run_in_runtime(_settings(tmp_path, tmp_path / "cache", 2, **failing),
                       RuntimeOptions(timeout_s=300, echo=False, workdir=tmp_path))  # fmt: skip
    err = info.value
    assert err.status == "finished:failed", str(err)
    assert "reached proxy-target-accuracy 0.99" in str(err)  # Flower's details
    assert "SettingsError: r-max-samples: no batch size" in err.log_tail  # the run's own
    assert err.kept is not None and (err.kept / "superlink.log").is_file()
    assert _own_processes() <= before
    assert not list((tmp_path / "runs").rglob("summary.json"))


@pytest.mark.slow
def test_a_run_past_its_deadline_is_stopped(tmp_path: Path) -> None:
    before = _own_processes()
    t0 = time.monotonic()
    with pytest.raises(RuntimeRunError) as info:
        run_in_runtime(_settings(tmp_path, tmp_path / "cache", 2, **{"num-rounds": 50}),
                       RuntimeOptions(timeout_s=15, echo=False, workdir=tmp_path))  # fmt: skip
    assert info.value.status == "timeout"
    assert "did not finish within 15 s" in str(info.value)
    assert time.monotonic() - t0 < 15 + 60
    assert _own_processes() <= before


@pytest.mark.slow
def test_a_superlink_that_dies_mid_run_leaves_nothing_behind(tmp_path: Path) -> None:
    """SIGKILL to the SuperLink while the simulation runs: its SuperExec,
    ``flwr-simulation`` and Ray, orphaned, are still found and stopped, and the error
    says what happened."""
    before = _own_processes()
    links: list[LocalSuperLink] = []
    seen: dict[int, int] = {}
    names: dict[int, str] = {}
    real_start = LocalSuperLink.start

    def start(self: LocalSuperLink, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        real_start(self, timeout_s)
        links.append(self)

    def kill_when_ray_runs() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if links and links[0].proc is not None:
                tree = process_tree(links[0].proc.pid)
                if any("raylet" in _cmdline(pid) for pid in tree):
                    seen.update(tree)
                    names.update({pid: _cmdline(pid)[:150] for pid in tree})
                    links[0].proc.kill()
                    return
            time.sleep(0.3)

    killer = threading.Thread(target=kill_when_ray_runs, daemon=True)
    killer.start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LocalSuperLink, "start", start)
        with pytest.raises(RuntimeRunError) as info:
            run_in_runtime(_settings(tmp_path, tmp_path / "cache", 2, **{"num-rounds": 50}),
                           RuntimeOptions(timeout_s=300, echo=False, workdir=tmp_path))  # fmt: skip
    killer.join(timeout=5)
    assert seen, "Ray never started below the SuperLink"
    assert info.value.status == "superlink-exited", str(info.value)
    assert "the SuperLink ended (exit status -9)" in str(info.value)
    assert _own_processes() <= before
    left = [p for p in seen if _state(p) not in ("gone", "Z")]
    assert not left, [(names.get(p), _cmdline(p)[:150], _state(p)) for p in left]


# ----------------------------------------------------------------------------- Ray cluster


def _ray_cli() -> str | None:
    local = Path(sys.executable).parent / "ray"
    return str(local) if local.is_file() else shutil.which("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive_nodes(address: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """``ray.nodes()`` of the cluster, from a driver attached to it (a process of its own)."""
    script = (
        "import json, ray\n"
        f"ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "print('NODES=' + json.dumps([{'id': n['NodeID'], 'cpu': n['Resources'].get('CPU')}"
        " for n in ray.nodes() if n['Alive']]))\n"
        "ray.shutdown()\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    for line in res.stdout.splitlines():
        if line.startswith("NODES="):
            nodes: list[dict[str, Any]] = json.loads(line[len("NODES=") :])
            return nodes
    raise AssertionError(f"no answer from the Ray cluster:\n{res.stdout}\n{res.stderr}")


class RayCluster:
    """A Ray head and a second Ray node on this host, each ``ray start --block`` in a
    session of its own, so each node's processes are that PID's process tree."""

    def __init__(self, root: Path, ray: str) -> None:
        self.root = root
        self.ray = ray
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": ""}
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}

    def start_node(self, name: str, *args: str) -> None:
        log = (self.root / f"{name}.log").open("ab")
        self.nodes[name] = subprocess.Popen(
            [
                self.ray, "start", *args, "--num-cpus", "1", "--num-gpus", "0",
                "--temp-dir", str(self.root / "ray"), "--object-store-memory", "100000000",
                "--block",
            ],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        log.close()

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def start(self, timeout: float = 90) -> None:
        self.start_node("head", "--head", "--port", str(self.port), "--include-dashboard=false")
        self._wait_log("head", "Ray runtime started", timeout)
        self.start_node("second", "--address", self.address)
        self._wait_log("second", "Ray runtime started", timeout)

    def _wait_log(self, name: str, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log(name):
            proc = self.nodes[name]
            assert proc.poll() is None, f"ray node {name} exited:\n{self.log(name)}"
            assert time.monotonic() < deadline, f"ray node {name} did not start:\n{self.log(name)}"
            time.sleep(0.5)

    def stop(self) -> None:
        for proc in reversed(list(self.nodes.values())):
            stop_tree(proc, grace_s=10.0)


@contextlib.contextmanager
def _watch_client_apps(cluster: RayCluster) -> Iterator[dict[str, set[int]]]:
    """Which Ray node ran a ClientApp: the ``ray::ClientAppActor`` workers seen in each
    node's process tree while the block runs."""
    seen: dict[str, set[int]] = {name: set() for name in cluster.nodes}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for name, proc in cluster.nodes.items():
                for pid in process_tree(proc.pid):
                    if "ClientAppActor" in _cmdline(pid):
                        seen[name].add(pid)
            stop.wait(0.3)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=5)


@pytest.mark.slow
def test_a_fleet_runs_across_a_two_node_ray_cluster(tmp_path: Path, cache_dir: Path) -> None:
    ray = _ray_cli()
    if ray is None:
        pytest.skip("the ray command is not installed")
    # Ray's socket paths must stay short: its own folder under /tmp, not pytest's
    root = Path(tempfile.mkdtemp(prefix="prt-", dir="/tmp"))
    cluster = RayCluster(root, ray)
    tree: dict[int, int] = {}
    try:
        cluster.start()
        deadline = time.monotonic() + 60
        while len(nodes := _alive_nodes(cluster.address, cluster.env)) < 2:
            assert time.monotonic() < deadline, f"the second node never joined: {nodes}"
            time.sleep(2)
        assert [n["cpu"] for n in nodes] == [1.0, 1.0]
        with _watch_client_apps(cluster) as ran_on:
            res = run_in_runtime(
                _settings(tmp_path, cache_dir, 3),
                RuntimeOptions(
                    ray_address=cluster.address, timeout_s=300, echo=False, workdir=tmp_path
                ),
            )
        assert res.status == "finished:completed"
        assert res.summary["rounds"] == 1
        assert all(v["rounds-ok"] == 1 for v in res.summary["nodes"].values())
        assert len(res.summary["nodes"]) == 3
        # Ray saw two nodes, and ClientApps ran on both (1 CPU each, 1 CPU per ClientApp)
        assert len(_alive_nodes(cluster.address, cluster.env)) == 2
        assert ran_on["head"] and ran_on["second"], ran_on
        for proc in cluster.nodes.values():
            tree.update(process_tree(proc.pid))
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert not [p for p in tree if _state(p) not in ("gone", "Z")]


def test_the_runtime_module_imports_without_torch_or_flower() -> None:
    """The caller's side stays light: PyTorch and Flower run in the runtime's processes."""
    code = (
        "import sys, simulations.runtime\n"
        "print(sorted(m for m in ('torch', 'flwr', 'ray') if m in sys.modules))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    assert res.stdout.strip() == "[]"


@pytest.mark.slow
def test_interrupt_stops_everything(tmp_path: Path) -> None:
    """Ctrl-C while the SuperLink starts: nothing is left running, the folder goes."""
    before = _own_processes()
    started = threading.Event()
    real_wait = LocalSuperLink._wait_ready

    def interrupted(self: LocalSuperLink, timeout_s: float) -> bool:
        assert real_wait(self, timeout_s)
        started.set()
        raise KeyboardInterrupt

    settings = {"fleet": str(_fleet(tmp_path, 2)), "output-dir": str(tmp_path / "runs")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LocalSuperLink, "_wait_ready", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_in_runtime(settings, RuntimeOptions(echo=False, workdir=tmp_path))
    assert started.is_set()
    assert _own_processes() <= before
    assert not list(tmp_path.glob("powerfl-rt-*"))
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_dir()]
