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
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
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
from simulations.superlink import (
    CLI_TIMEOUT_S,
    CONNECTION,
    LocalSuperLink,
    RunStream,
    RuntimeRunError,
    flower_bin,
)

#: The oldest Flower this module is checked with: its SuperLink serves the Control, Runtime
#: and Fleet APIs over HTTP on one ``--host``/``--port``, and the CLI talks HTTP to it.
#: Older releases (1.30 … 1.36 at least) have gRPC APIs on separate addresses instead.
MIN_FLOWER = (1, 41)
#: What the app is made of: the packages its ServerApp and ClientApp import (``configs``
#: carries the data files they read: device twins, fleets).
APP_PARTS = ("configs", "fl_client", "fl_server", "strategies")
#: The run setting that names the run's own folder (see the module's docstring).
RUN_DIR_KEY = "run-dir"
#: The run setting that tells the ServerApp its nodes are the fleet file's (a simulation),
#: so it can name a node that failed, as ``make_server_app(fleet=…)`` does in-process.
SIMULATED_FLEET_KEY = "simulated-fleet"
#: How Ray is started for a simulation (as ``simulations.run`` does).
RAY_LOGGING_LEVEL = "WARNING"
#: Seconds Flower may take to record the run's final status after its log ended.
STATUS_GRACE_S = 60.0
#: Default deadline for a whole run.
DEFAULT_TIMEOUT_S = 6 * 3600.0
FINISHED_OK = "finished:completed"


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
    overrides: Mapping[str, Any], options: RuntimeOptions | None = None
) -> RuntimeResult:
    """Run one simulation of the app with these run settings through Flower's Simulation
    Runtime; return its summary (see the module's docstring for the steps). ``options``:
    how it runs (``RuntimeOptions``; default: its defaults).

    Raises ``SettingsError`` for a setting that cannot go to Flower, ``RuntimeRunError``
    when the run did not complete (its status and log tail in the message).
    """
    opts = options if options is not None else RuntimeOptions()
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
