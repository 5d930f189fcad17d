"""One simulation of the app through Flower's Simulation Runtime, the path behind ``flwr run``.

``run_in_runtime(overrides)`` does what ``flwr run`` against a local simulation SuperLink
does, with a SuperLink of its own:

1. stages the app (its packages and a pyproject.toml that declares every setting the run
   overrides) in a private temporary folder, which also holds the run's ``$FLWR_HOME``;
2. starts ``flower-superlink --insecure --simulation`` on a free port of 127.0.0.1 with its
   own database there (never the user's default local SuperLink), and writes the connection;
3. submits the run: ``flwr run <app> <connection> --run-config <overrides.toml>
   --federation-config "num-supernodes=<fleet size> client-resources-num-cpus=… …"
   --stream``;
4. relays the run's log (``flwr run … --stream``) to the console as it comes, Flower's
   own start-up notes left out;
5. waits for the run with a deadline, asks Flower for its final status (``flwr ls``: a
   failed run is an error that carries the log's tail; ``flwr run`` itself exits 0 then);
6. reads the run's ``summary.json`` from the run folder it knows to be its own, and
7. always stops the SuperLink and everything it started (SuperExec, ``flwr-simulation``,
   a private Ray), by PID, also on an exception or Ctrl-C. The SuperLink and ``flwr run``
   stay in the caller's process group, so a signal to the group (a terminal's Ctrl-C, a
   study ending a cell's process group) reaches them as well.

Its own run folder: when the app has the ``run-dir`` run setting, the folder is created
here (``<output-dir>/<UTC time>-<method>``, as the ServerApp names it) and handed to the
run; without it, the run gets a fresh output folder of its own,
``<output-dir>/runtime-<UTC time>-<random hex>/``, which holds only this run's folder.

Ray: by default ``flwr-simulation`` starts a private Ray with ``os.cpu_count()`` CPUs
(``RAY_ADDRESS=local``, so it never joins a cluster found on the host). With
``ray_address`` it joins that existing cluster instead (``RAY_ADDRESS`` in the SuperLink's
environment, no CPU/GPU counts: the cluster's nodes declare theirs): a fleet larger than one
machine. Every Ray node must be able to import the app (``pip install`` it there), since
the ClientApps run in Ray workers on those nodes.

Resources: Flower gives every simulated node the same ``client_resources``; this module
passes one CPU/GPU share per node (``NodeResources``). A fractional CPU share is given as
1 CPU of a Ray that counts ``cpu_count / share`` logical CPUs (Flower's federation config
takes whole CPUs); a GPU share may be fractional as it is.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import math
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import tomli_w

from fl_client.files import check_run_records
from fl_client.settings import (
    RunSettings,
    SettingsError,
    load_fleet,
    tomllib,
    with_app_paths,
)
from fl_client.shipped import app_pyproject, package_root
from simulations.processes import alive, process_tree, terminate

#: The oldest Flower this module is checked with: its SuperLink serves the Control, Runtime
#: and Fleet APIs over HTTP on one ``--host``/``--port``, and the CLI talks HTTP to it.
#: Older releases (1.30 … 1.36 at least) have gRPC APIs on separate addresses instead.
MIN_FLOWER = (1, 41)
#: Quiet, offline Flower in every process of the run (``simulations.run.flower_env`` sets
#: them in ``powerfl``'s own process too).
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
#: What the app is made of: the packages its ServerApp and ClientApp import (``configs``
#: carries the data files they read: device twins, fleets).
APP_PARTS = ("configs", "fl_client", "fl_server", "strategies")
#: The run setting that names the run's own folder (see the module's docstring).
RUN_DIR_KEY = "run-dir"
#: The run setting that tells the ServerApp its nodes are the fleet file's (a simulation),
#: so it can name a node that failed, as ``make_server_app(fleet=…)`` does in-process.
SIMULATED_FLEET_KEY = "simulated-fleet"
CONNECTION = "powerfl-runtime"
#: How Ray is started for a simulation (as ``simulations.run`` does).
RAY_LOGGING_LEVEL = "WARNING"
#: Seconds: SuperLink start-up, a ``flwr`` command, Flower's final status after the log.
STARTUP_TIMEOUT_S = 90.0
CLI_TIMEOUT_S = 120.0
STATUS_GRACE_S = 60.0
#: Default deadline for a whole run.
DEFAULT_TIMEOUT_S = 6 * 3600.0
#: Lines of the run's log kept for an error message.
TAIL_LINES = 60
FINISHED_OK = "finished:completed"
#: Flower's notes about its own runtime, left out of the relayed log (matched on the line
#: without colour codes). Everything else the run prints is relayed as it is.
FLOWER_NOTES = tuple(
    re.compile(p)
    for p in (
        r"^Using SuperLink: ",
        r"Starting logstream for run_id",
        r"Exiting logstream",
        r"Starting Flower Simulation\s*$",
        r"default simulated SuperNodes changed",
        r"Federation `[^`]*` \(\d+ simulated SuperNodes\)",
        r"To change federation size",
        r"flwr federation simulation-config",
        r"^Successfully installed \S+ to ",
        r"^(INFO|WARNING|DEBUG)\s*:\s*$",
        r"Manually terminating ClientAppActor",  # Ray's actors, stopped at the run's end
    )
)
#: ``flwr run``'s line that names the run it started.
STARTED = re.compile(r"Successfully started run (\d+)")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class RuntimeRunError(RuntimeError):
    """A run through the Simulation Runtime that did not complete: its status (Flower's,
    or why none), the tail of its log, and where its files were kept."""

    def __init__(
        self, message: str, *, status: str = "", log_tail: str = "", kept: Path | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.log_tail = log_tail
        self.kept = kept

    def __str__(self) -> str:
        text = self.message
        if self.log_tail:
            text += f"\n--- the run's log, last lines ---\n{self.log_tail.rstrip()}"
        if self.kept is not None:
            text += f"\n(the SuperLink's log, the run's full log and the staged app: {self.kept})"
        return text


@dataclass(frozen=True)
class NodeResources:
    """What each simulated node's ClientApp reserves in Ray: a share of a CPU and of a
    GPU. Flower applies one share to every node of the fleet."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.num_cpus) and self.num_cpus > 0):
            raise SettingsError(f"num-cpus: {self.num_cpus!r} must be a number > 0")
        if not (math.isfinite(self.num_gpus) and self.num_gpus >= 0):
            raise SettingsError(f"num-gpus: {self.num_gpus!r} must be a number ≥ 0")


@dataclass(frozen=True)
class RuntimeResult:
    """A completed run: Flower's run id and status, its folder and summary, wall time."""

    run_id: int
    status: str
    run_dir: Path
    summary: dict[str, Any]
    wall_s: float


# ----------------------------------------------------------------------------- settings


def flower_version() -> tuple[int, ...]:
    """The installed Flower's version as numbers (``1.41.0`` → ``(1, 41, 0)``)."""
    text = importlib.metadata.version("flwr")
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def check_flower() -> None:
    """Refuse a Flower older than ``MIN_FLOWER``, before anything starts."""
    found = flower_version()
    if found < MIN_FLOWER:
        raise SettingsError(
            f"flwr {'.'.join(map(str, found))}: the Simulation Runtime path needs flwr >= "
            f"{'.'.join(map(str, MIN_FLOWER))} (a SuperLink with one HTTP address)"
        )


def app_has_setting(key: str) -> bool:
    """Whether the app knows this run setting (``run-dir``, ``simulated-fleet``: hooks the
    runtime uses when the app has them)."""
    keys = RunSettings.keys()
    return key in keys


def config_value(key: str, value: Any) -> bool | int | float | str:
    """A run setting as Flower's run config holds it (bool, int, float or str)."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    raise SettingsError(f"{key}: {value!r} is not a bool, number or string")


def federation_config(
    num_nodes: int,
    resources: NodeResources,
    *,
    ray_address: str | None = None,
    backend: str = "ray",
    cpu_count: int | None = None,
) -> dict[str, Any]:
    """``--federation-config`` of the run (Flower's ``SimulationConfig`` fields, kebab-case).

    Private Ray: ``init-args-num-cpus`` is the host's CPU count, or, for a fractional CPU
    share s, ``floor(cpu_count / s)`` logical CPUs of which each node takes 1 (Flower takes
    whole CPUs per node). An attached cluster: no init args for CPUs or GPUs (Ray refuses
    them when it joins a cluster), and a CPU share must be whole.
    """
    if num_nodes < 1:
        raise SettingsError(f"fleet: {num_nodes} nodes; a simulation needs at least one")
    cpus = resources.num_cpus
    whole = float(cpus).is_integer()
    cfg: dict[str, Any] = {"num-supernodes": int(num_nodes), "backend": backend}
    if ray_address:
        if not whole:
            raise SettingsError(
                f"num-cpus: {cpus:g} per node on an existing Ray cluster; Flower takes whole "
                "CPUs per node, so give a whole number (start the cluster's nodes with more "
                "logical CPUs, `ray start --num-cpus`, for smaller shares)"
            )
        cfg["client-resources-num-cpus"] = int(cpus)
    else:
        count = cpu_count or os.cpu_count() or 2
        cfg["client-resources-num-cpus"] = int(cpus) if whole else 1
        cfg["init-args-num-cpus"] = count if whole else max(1, math.floor(count / cpus))
    cfg["client-resources-num-gpus"] = float(resources.num_gpus)
    cfg["init-args-logging-level"] = RAY_LOGGING_LEVEL
    cfg["init-args-log-to-driver"] = True
    return cfg


def federation_config_arg(cfg: Mapping[str, Any]) -> str:
    """The ``--federation-config`` string: ``key=value`` pairs, values in TOML."""
    parts = []
    for key, value in cfg.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = json.dumps(value)
        else:
            text = repr(value)
        parts.append(f"{key}={text}")
    return " ".join(parts)


# ----------------------------------------------------------------------------- staging


def stage_app(dst: Path, run_config: Mapping[str, Any]) -> Path:
    """A copy of the Flower app in ``dst`` for ``flwr run`` to package.

    Its pyproject.toml has no legacy ``[tool.flwr.federations]`` (``flwr run`` would
    otherwise migrate it in place), and its ``[tool.flwr.app.config]`` declares every key of
    ``run_config``: Flower refuses a ``--run-config`` key the app does not declare, while
    the ServerApp and ClientApp also read settings that only have a default in code.
    """
    dst.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    root = package_root().parent  # the source tree, or site-packages for a wheel
    for part in APP_PARTS:
        shutil.copytree(root / part, dst / part, ignore=ignore)
    pyproject = app_pyproject()
    if pyproject is None:
        raise SettingsError(
            "powerfl: this install has no app pyproject.toml (a wheel built without setup.py's "
            "copy); reinstall powerfl from its source or a wheel built with `pip wheel`"
        )
    with pyproject.open("rb") as fh:
        project = tomllib.load(fh)
    project.get("project", {}).pop("readme", None)  # Flower packages the app without it
    flwr = project.setdefault("tool", {}).setdefault("flwr", {})
    flwr.pop("federations", None)
    declared = flwr.setdefault("app", {}).setdefault("config", {})
    for key, value in run_config.items():
        declared.setdefault(key, value)
    with (dst / "pyproject.toml").open("wb") as fh:
        tomli_w.dump(project, fh)
    return dst


# ----------------------------------------------------------------------------- processes


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stop_tree(
    proc: subprocess.Popen[Any], grace_s: float = 5.0, known: Mapping[int, int] | None = None
) -> None:
    """Stop ``proc`` and every process it started, by PID: SIGTERM to each (again to any
    that appears meanwhile), SIGKILL to those alive after ``grace_s``.

    Each process is followed by its start time, so one orphaned by its parent's exit is
    still stopped and a reused PID never is. ``known``: processes seen below ``proc``
    earlier (PID → start time); those still alive, and what is below them, are stopped too,
    so a tree whose root died first (orphans, reparented away) is still found.
    """

    def find(seen: Mapping[int, int]) -> dict[int, int]:
        found: dict[int, int] = {}
        if proc.poll() is None:  # not reaped yet: its PID is still its own
            found.update(process_tree(proc.pid))
        for pid, started in {**dict(known or {}), **seen}.items():
            if alive(pid, started):
                tree = process_tree(pid)
                if tree.get(pid) == started:
                    found.update(tree)
        return found

    seen = terminate(find, grace_s, poll_s=0.1)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    gone_by = time.monotonic() + 5.0  # a large process takes a moment to go
    while any(alive(pid, started) for pid, started in seen.items()):
        if time.monotonic() >= gone_by:
            break
        time.sleep(0.05)


def flower_bin(name: str) -> str:
    """A Flower command: next to this Python (the project's environment), else on PATH."""
    local = Path(sys.executable).parent / name
    if local.is_file():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name}: not found next to {sys.executable} nor on PATH")
    return found


def write_connection(home: Path, address: str) -> Path:
    """``<home>/config.toml`` with one SuperLink connection, ``CONNECTION``, the default:
    the insecure one to this run's own SuperLink on 127.0.0.1 (the format of
    ``deploy.connection``, which writes TLS connections to a real federation)."""
    path = home / "config.toml"
    home.mkdir(parents=True, exist_ok=True)
    data = {
        "superlink": {"default": CONNECTION, CONNECTION: {"address": address, "insecure": True}}
    }
    with path.open("wb") as fh:
        tomli_w.dump(data, fh)
    return path


def runtime_env(flwr_home: Path, ray_address: str | None) -> dict[str, str]:
    """The environment of the SuperLink (inherited by SuperExec, ``flwr-simulation`` and a
    private Ray) and of the ``flwr`` commands."""
    env = {**os.environ, **FLOWER_ENV}
    env["FLWR_HOME"] = str(flwr_home)
    bindir = str(Path(sys.executable).parent)  # SuperLink starts flower-superexec by name
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("RAY_DEDUP_LOGS", "0")
    env.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # "local": a private Ray, never one found on the host (/tmp/ray/ray_current_cluster)
    env["RAY_ADDRESS"] = ray_address or "local"
    if sys.stdout.isatty() and "COLUMNS" not in env:  # the run's tables as wide as ours
        with contextlib.suppress(OSError):
            env["COLUMNS"] = str(os.get_terminal_size(sys.stdout.fileno()).columns)
    return env


@dataclass
class LocalSuperLink:
    """A SuperLink in simulation mode on 127.0.0.1, with its own home and database under
    ``root``, and the ``flwr`` commands that talk to it."""

    root: Path
    ray_address: str | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: Every process seen below the SuperLink (PID → start time), kept up to date by a
    #: thread: what ``stop`` ends even when the SuperLink itself died first.
    known: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _done: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def home(self) -> Path:
        return self.root / "flwr-home"

    @property
    def log_path(self) -> Path:
        return self.root / "superlink.log"

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        self.env = runtime_env(self.home, self.ray_address)
        for attempt in range(3):  # a free port can be taken before the SuperLink binds it
            self.port = free_port()
            write_connection(self.home, f"127.0.0.1:{self.port}")
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(
                    [
                        flower_bin("flower-superlink"),
                        "--insecure",
                        "--simulation",
                        "--isolation",
                        "subprocess",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(self.port),
                        "--database",
                        str(self.root / "state.db"),
                        "--disable-runtime-dependency-installation",
                    ],
                    cwd=self.root,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if self._wait_ready(timeout_s):
                self._done.clear()
                threading.Thread(
                    target=self._watch, name="powerfl-superlink-tree", daemon=True
                ).start()
                return
            self.stop()
            if attempt == 2 or "address already in use" not in self.log().lower():
                break
        raise RuntimeRunError(
            "the SuperLink did not start", status="superlink-failed", log_tail=self.log()[-4000:]
        )

    def _wait_ready(self, timeout_s: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.port}/health"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(url, timeout=1.0) as res,
            ):
                if 200 <= res.status < 300:
                    return True
            time.sleep(0.2)
        return False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _watch(self) -> None:
        """Every half second, what runs below the SuperLink and below anything seen there
        before (orphans of a process that ended stay followed)."""
        proc = self.proc
        while proc is not None and not self._done.wait(0.5):
            with self._lock:
                known = dict(self.known)
            found = process_tree(proc.pid) if proc.poll() is None else {}
            for pid, started in known.items():
                if pid not in found and alive(pid, started):
                    tree = process_tree(pid)
                    if tree.get(pid) == started:
                        found.update(tree)
            with self._lock:
                self.known.update(found)

    def stop(self) -> None:
        self._done.set()
        if self.proc is not None:
            with self._lock:
                known = dict(self.known)
            stop_tree(self.proc, known=known)

    def exit_status(self) -> int | None:
        """The SuperLink's exit status, None while it runs."""
        return None if self.proc is None else self.proc.poll()

    # ------------------------------------------------------------------ flwr CLI
    def flwr(self, *args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [flower_bin("flwr"), *args],
            cwd=self.root,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def flwr_json(self, *args: str, timeout: float = CLI_TIMEOUT_S) -> dict[str, Any]:
        res = self.flwr(*args, "--format", "json", timeout=timeout)
        match = re.search(r"^\{.*^\}", res.stdout, re.S | re.M)
        data: dict[str, Any] = json.loads(match.group(0)) if match else {}
        if res.returncode != 0 or not data.get("success", False):
            raise RuntimeRunError(
                f"`flwr {' '.join(args)}` failed (exit status {res.returncode})",
                status="flwr-cli-failed",
                log_tail=(res.stdout + res.stderr)[-3000:],
            )
        return data

    def run_info(self, run_id: int) -> dict[str, Any]:
        runs = self.flwr_json("ls", CONNECTION, "--run-id", str(run_id))["runs"]
        return dict(runs[0]) if runs else {}

    def stop_run(self, run_id: int) -> None:
        with contextlib.suppress(Exception):
            self.flwr("stop", str(run_id), CONNECTION, timeout=30)


class RunStream:
    """``flwr run <app> <connection> … --stream`` in a process of its own, read by a thread:
    it submits the run, then streams the run's log until the run ends. The run's id comes
    from its first line; each line of the log goes to ``out`` (Flower's runtime notes left
    out; ``echo=False``: none) and in full to ``path``, and its last lines are kept for an
    error message."""

    def __init__(
        self, argv: list[str], link: LocalSuperLink, out: TextIO | None, path: Path, echo: bool
    ) -> None:
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.run_id: int | None = None
        self._started = threading.Event()
        self._out = out
        self._echo = echo
        self._path = path
        self.proc = subprocess.Popen(
            argv,
            cwd=link.root,
            env=link.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._thread = threading.Thread(target=self._pump, name="powerfl-run-log", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        try:
            with self._path.open("ab") as full:
                for raw in iter(self.proc.stdout.readline, b""):
                    full.write(raw)
                    full.flush()
                    self._line(raw.decode("utf-8", errors="replace"))
        finally:
            self._started.set()

    def _line(self, line: str) -> None:
        plain = ANSI.sub("", line).rstrip("\n")
        if self.run_id is None:
            started = STARTED.search(plain)
            if started:
                self.run_id = int(started.group(1))
                self._started.set()
                return
        if any(p.search(plain) for p in FLOWER_NOTES):
            return
        self.tail.append(plain)
        if self._echo:
            out = self._out or sys.stdout
            with contextlib.suppress(Exception):
                out.write(line if line.endswith("\n") else line + "\n")
                out.flush()

    def wait_started(self, timeout: float) -> int | None:
        """The run's id once Flower accepted it; None when ``flwr run`` failed or did not
        answer within ``timeout`` seconds."""
        self._started.wait(timeout)
        return self.run_id

    def wait(self, timeout: float | None) -> bool:
        """True when the stream ended (the run finished) within ``timeout`` seconds."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        self._thread.join(timeout=10)
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            stop_tree(self.proc, grace_s=2.0)
        self._thread.join(timeout=5)

    def tail_text(self) -> str:
        return "\n".join(self.tail)


# ----------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class RuntimeOptions:
    """How ``run_in_runtime`` runs: ``num_nodes``, the fleet size (default: the fleet
    file's); ``resources``, each node's CPU/GPU share (default 1 CPU); ``ray_address``, join
    this Ray cluster (``host:port`` of its head) instead of starting a private Ray;
    ``timeout_s``, deadline of the whole run (None: none); ``out``/``echo``, where the run's
    log goes (default stdout) and whether it does; ``workdir``, where the private folder is
    made (default: the system's temp folder), removed after a completed run unless
    ``keep_files`` and kept after a failed one."""

    num_nodes: int | None = None
    resources: NodeResources | None = None
    ray_address: str | None = None
    backend: str = "ray"
    timeout_s: float | None = DEFAULT_TIMEOUT_S
    out: TextIO | None = None
    echo: bool = True
    workdir: Path | None = None
    keep_files: bool = False


def run_in_runtime(
    overrides: Mapping[str, Any], options: RuntimeOptions | None = None, **kwargs: Any
) -> RuntimeResult:
    """Run one simulation of the app with these run settings through Flower's Simulation
    Runtime; return its summary (see the module's docstring for the steps). ``options`` (or
    its fields as keyword arguments): ``RuntimeOptions``.

    Raises ``SettingsError`` for a setting that cannot go to Flower, ``RuntimeRunError``
    when the run did not complete (its status and log tail in the message).
    """
    opts = options if options is not None else RuntimeOptions(**kwargs)
    t0 = time.perf_counter()
    check_flower()
    config = with_app_paths(overrides)
    settings = RunSettings.from_config(config)
    num_nodes = len(load_fleet(settings.fleet)) if opts.num_nodes is None else opts.num_nodes
    resources = opts.resources or NodeResources()
    fed = federation_config(
        num_nodes, resources, ray_address=opts.ray_address, backend=opts.backend
    )
    root = Path(opts.workdir or tempfile.gettempdir()) / f"powerfl-rt-{secrets.token_hex(6)}"
    run_dir = private_out = None
    link = LocalSuperLink(root, ray_address=opts.ray_address)
    stream: RunStream | None = None
    keep = True  # the private folder, for a run that failed
    try:
        root.mkdir(mode=0o700, parents=True)  # in the try: a signal now leaves no folder
        run_dir, private_out = _claim_output(config, settings)
        run_config = {k: config_value(k, v) for k, v in config.items() if v is not None}
        app = stage_app(root / "app", run_config)
        run_config_file = root / "run-config.toml"
        with run_config_file.open("wb") as fh:
            tomli_w.dump(run_config, fh)
        link.start()
        argv = [
            flower_bin("flwr"), "run", str(app), CONNECTION,
            "--run-config", str(run_config_file),
            "--federation-config", federation_config_arg(fed),
            "--stream",
        ]  # fmt: skip
        stream = RunStream(argv, link, opts.out, root / "run.log", opts.echo)
        run_id, status = _await_run(stream, link, t0, opts.timeout_s)
        folder = _own_run_folder(run_dir, private_out)
        if folder is None:
            raise RuntimeRunError(
                f"run {run_id} completed without writing a summary.json "
                f"(in {run_dir or private_out}): see the log's tail",
                status=status,
                log_tail=stream.tail_text(),
            )
        summary = json.loads((folder / "summary.json").read_text())
        keep = opts.keep_files
        return RuntimeResult(run_id, status, folder, summary, time.perf_counter() - t0)
    except RuntimeRunError as err:
        err.kept = root
        raise
    except KeyboardInterrupt:  # stopped by the user: nothing to look into
        keep = opts.keep_files
        raise
    finally:
        try:
            if stream is not None:
                stream.stop()
            link.stop()
        finally:  # also when a signal comes while the processes are stopped
            if not keep:
                shutil.rmtree(root, ignore_errors=True)
            for folder in (run_dir, private_out):  # a run that wrote nothing leaves no folder
                with contextlib.suppress(OSError):
                    if folder is not None and not any(folder.iterdir()):
                        folder.rmdir()


def _claim_output(config: dict[str, Any], settings: RunSettings) -> tuple[Path | None, Path | None]:
    """Where this run writes, set in ``config``: its own run folder (``run-dir``, when the
    app has that hook: the caller's, else a new ``<output-dir>/<UTC>-<method>``), or else a
    private output folder that holds only this run. Returns (run folder, private folder)."""
    if app_has_setting(SIMULATED_FLEET_KEY):
        config[SIMULATED_FLEET_KEY] = True
    if not app_has_setting(RUN_DIR_KEY):
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        private_out = Path(settings.output_dir) / f"runtime-{stamp}-{secrets.token_hex(3)}"
        private_out.mkdir(parents=True)
        config["output-dir"] = str(private_out)
        return None, private_out
    if config.get(RUN_DIR_KEY):  # the caller named it
        run_dir = Path(config[RUN_DIR_KEY])
        check_run_records(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        from fl_server.results import new_run_dir

        run_dir = new_run_dir(settings.output_dir, settings.method)
    config[RUN_DIR_KEY] = str(run_dir)
    return run_dir, None


def _await_run(
    stream: RunStream, link: LocalSuperLink, t0: float, timeout_s: float | None
) -> tuple[int, str]:
    """The run's id and final status once it completed; ``RuntimeRunError`` when it did not
    start, ran past ``timeout_s`` (it is stopped), lost its SuperLink or did not complete."""
    run_id = stream.wait_started(CLI_TIMEOUT_S)
    if run_id is None:
        raise RuntimeRunError(
            "`flwr run` did not start the run", status="not-started",
            log_tail=stream.tail_text(),
        )  # fmt: skip
    remaining = None if timeout_s is None else max(1.0, timeout_s - (time.perf_counter() - t0))
    if not stream.wait(remaining):
        link.stop_run(run_id)
        raise RuntimeRunError(
            f"run {run_id} did not finish within {timeout_s:.0f} s; it was stopped",
            status="timeout",
            log_tail=stream.tail_text(),
        )
    if link.exit_status() is not None:
        raise RuntimeRunError(
            f"the SuperLink ended (exit status {link.exit_status()}) during run {run_id}",
            status="superlink-exited",
            log_tail=stream.tail_text() + "\n--- the SuperLink's log ---\n" + link.log()[-3000:],
        )
    status, details = _final_status(link, run_id)
    if status != FINISHED_OK:
        raise RuntimeRunError(
            f"run {run_id} ended {status}" + (f": {details}" if details else ""),
            status=status,
            log_tail=stream.tail_text(),
        )
    return run_id, status


def _final_status(link: LocalSuperLink, run_id: int) -> tuple[str, str]:
    """Flower's final status of the run (``finished:…``) and its details; the log stream
    can end a moment before Flower records the status."""
    deadline = time.monotonic() + STATUS_GRACE_S
    info: dict[str, Any] = {}
    while time.monotonic() < deadline:
        info = link.run_info(run_id)
        status = str(info.get("status", ""))
        if status.startswith("finished"):
            details = str(info.get("status-details", "") or "")
            return status, "" if details == "N/A" else details
        time.sleep(1.0)
    return f"{info.get('status', 'unknown')} (not finished after the log ended)", ""


def _own_run_folder(run_dir: Path | None, private_out: Path | None) -> Path | None:
    """The run's folder if it holds a summary.json: the ``run-dir`` given to the run, or
    the one folder in the run's private output folder."""
    if run_dir is not None:
        return run_dir if (run_dir / "summary.json").is_file() else None
    assert private_out is not None
    found = [p.parent for p in private_out.glob("*/summary.json")]
    return found[0] if len(found) == 1 else None
