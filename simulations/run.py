"""Run one Flower simulation of a fleet as a function: the ``simulate`` command and the
studies call it the same way, and get back that run's own summary.

Two engines (``default_engine()`` picks): ``runtime``, the default on Flower ≥ 1.41, goes
through Flower's Simulation Runtime, the path behind ``flwr run`` (``simulations.runtime``: a
SuperLink of its own in simulation mode, on a private Ray or on an existing Ray cluster);
``in-process``, the default on an older Flower, runs Flower's ``run_simulation`` in this
process (deprecated from flwr 1.41).

Also what ends a run cleanly: ``interruptible()`` turns SIGINT, SIGTERM and SIGHUP into a
``RunInterrupted`` exception in the main thread, and ``stop_engine()`` ends the simulation
engine's processes (Ray's), so an interrupted run leaves no process behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from fl_client.files import check_run_records, claim_run_folder, release_run_folder
from fl_client.preflight import check_before_start
from fl_client.settings import (
    NodeSettings,
    RunSettings,
    SettingsError,
    load_fleet,
    resolve_path,
    with_app_paths,
)
from simulations.processes import descendants, terminate
from simulations.runtime import MIN_FLOWER, flower_version
from simulations.superlink import FLOWER_ENV
from simulations.tracking import check_tracking, log_run

if TYPE_CHECKING:
    from fl_client.partitions import SplitReport
    from simulations.runtime import NodeResources

#: Nodes shown in the console's data-split lines (all of them are in split.json).
SPLIT_LINES = 16

#: How ``simulate`` runs the simulation: ``runtime`` (Flower's Simulation Runtime, the path
#: behind ``flwr run``: ``simulations.runtime``; the default where the installed Flower has
#: it) or ``in-process`` (Flower's ``run_simulation`` here, deprecated from Flower 1.41; the
#: default on older Flower, e.g. 1.30 on a Jetson's Python 3.10).
ENGINES = ("runtime", "in-process")
#: How Ray is started for a simulation (Flower's defaults for its simulation engine).
RAY_INIT_ARGS = {"include_dashboard": False, "logging_level": "WARNING", "log_to_driver": True}
#: Signals that end a run: each gives exit status 128 + its number (SIGINT 130, SIGTERM 143).
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def flower_env(flwr_home: Path | None = None) -> None:
    """Quiet, offline Flower. Its home: ``$FLWR_HOME`` (relative to the current directory)
    if set, else ``flwr_home``, else ``.flwr`` in the current directory."""
    for key, value in FLOWER_ENV.items():
        os.environ.setdefault(key, value)
    home = os.environ.get("FLWR_HOME", "").strip()
    home_path = Path(home).expanduser().absolute() if home else flwr_home or Path.cwd() / ".flwr"
    os.environ["FLWR_HOME"] = str(home_path)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")


def preflight(overrides: dict[str, Any]) -> tuple[RunSettings, list[NodeSettings]]:
    """Every check of a run that needs no engine, PyTorch or Flower (fast): the settings,
    the fleet file and ``check_before_start``. Raises SettingsError naming the key."""
    settings = RunSettings.from_config(overrides)
    fleet = load_fleet(settings.fleet)
    check_before_start(settings, fleet)
    check_tracking(settings)
    if settings.run_dir:
        check_run_records(resolve_path(settings.run_dir))
    return settings, fleet


def check_partitions(
    settings: Any, num_nodes: int, names: Sequence[str] | None = None
) -> SplitReport:
    """Refuse a dataset that cannot be used (``dataset``) or a fleet its data cannot be split
    over, before any engine starts; return each node's share (``data_splits.split_report``)."""
    from fl_client import data_splits

    data_splits.check_dataset(settings.dataset)
    if getattr(settings, "proxy_dataset", ""):
        try:
            data_splits.check_dataset(settings.proxy_dataset)
        except SettingsError as err:  # its message names ``dataset``: say which one
            raise SettingsError(f"proxy-{err}") from None
    try:
        return data_splits.split_report(
            num_nodes, spec=data_splits.PartitionSpec.of(settings), names=names
        )
    except ValueError as err:  # SettingsError too: the split's own checks name their key
        pool = data_splits.load_splits(settings.dataset, settings.seed).sizes()["pool"]
        raise SettingsError(
            f"fleet: the {pool} training images of {settings.dataset} cannot be split over "
            f"{num_nodes} nodes: {err}"
        ) from None


def check_initial_weights(settings: RunSettings) -> None:
    """Refuse an ``initial-weights`` checkpoint that cannot be read or does not fit the
    model (``fl_client.checkpoint.check``: the first mismatched key with both shapes),
    before any engine starts."""
    if settings.initial_weights:
        from fl_client import checkpoint

        checkpoint.check(resolve_path(settings.initial_weights), settings.model)


def estimate_r_before_start(settings: RunSettings) -> None:
    """Eq. 3's r, estimated here before any engine starts, into the run's r cache, where
    the server finds it (the same round-0 weights: ``r_estimation.round0_model``). A
    proxy target no batch size reaches within ``r-max-samples`` is then a SettingsError
    naming the key, exit 2 (it used to end the run inside the engine, with a server
    traceback and Flower's exit code 700)."""
    from fl_client.r_estimation import estimate_run_r, round0_model

    model, weights = round0_model(settings)
    estimate_run_r(settings, model.state_dict(), weights.sha256 if weights else "")


def default_engine() -> str:
    """``runtime`` where the installed Flower has the Simulation Runtime path this app
    uses (``simulations.runtime.MIN_FLOWER``), else ``in-process``."""
    return "runtime" if flower_version() >= MIN_FLOWER else "in-process"


def simulate(
    overrides: dict[str, Any],
    *,
    backend: str = "ray",
    num_cpus_per_node: float = 1.0,
    num_gpus_per_node: float = 0.0,
    engine: str | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Run one Flower simulation of the fleet with these run settings; return its summary.

    Everything that can be checked is checked before the engine starts (``preflight``,
    then the data split, whose lines are printed and saved in the run's folder, the
    initial weights, and r, estimated here into the cache the server reads).
    ``engine``: ``runtime`` goes through Flower's Simulation Runtime
    (``simulations.runtime.run_in_runtime``), as does any ``ray_address``;
    ``in-process`` runs Flower's ``run_simulation`` here; None: ``default_engine()``. With
    ``ray_address`` (``host:port`` of an existing Ray cluster's head, which the run
    joins). Each simulated node reserves ``num_cpus_per_node`` CPUs and
    ``num_gpus_per_node`` of a GPU in Ray (one share for all nodes). Interrupted
    (``RunInterrupted``), it stops the engine's processes before the exception goes on.
    """
    engine = engine or ("runtime" if ray_address else default_engine())
    if engine not in ENGINES:
        raise SettingsError(f"--engine: unknown engine {engine!r}; allowed: {', '.join(ENGINES)}")
    from simulations.runtime import NodeResources  # light: no PyTorch, Flower or Ray

    resources = NodeResources(num_cpus=num_cpus_per_node, num_gpus=num_gpus_per_node)
    overrides = with_app_paths(overrides)
    settings, fleet = preflight(overrides)
    split = check_partitions(settings, len(fleet), [n.name for n in fleet])
    check_initial_weights(settings)
    estimate_r_before_start(settings)
    if settings.run_dir:  # a run owns its folder: a second run given it is refused
        claim_run_folder(resolve_path(settings.run_dir))
    try:
        print("\n".join(split.lines(most=SPLIT_LINES)), flush=True)
        if engine == "runtime" or ray_address:
            summary = _simulate_in_runtime(overrides, fleet, resources, backend, ray_address)
        else:
            summary = _simulate_in_process(overrides, fleet, resources, backend)
    finally:
        if settings.run_dir:
            release_run_folder(resolve_path(settings.run_dir))
    if summary.get("run-dir"):
        split.save(Path(summary["run-dir"]))
        log_run(settings, summary["run-dir"])  # tracking = "mlflow": never fails the run
    return summary


def _simulate_in_process(
    overrides: dict[str, Any],
    fleet: list[NodeSettings],
    resources: NodeResources,
    backend: str,
) -> dict[str, Any]:
    """Flower's ``run_simulation`` in this process (Ray started here, our signal handlers
    put back after it)."""
    from flwr.simulation import run_simulation

    from fl_client.client_app import make_client_app
    from fl_server.server_app import make_server_app

    summaries: list[dict[str, Any]] = []
    init_args: dict[str, Any] = {**RAY_INIT_ARGS, "num_cpus": os.cpu_count() or 2}
    try:
        if backend == "ray":
            start_ray(init_args)
        run_simulation(
            server_app=make_server_app(overrides, on_summary=summaries.append, fleet=fleet),
            client_app=make_client_app(overrides),
            num_supernodes=len(fleet),
            backend_name=backend,
            backend_config={
                "client_resources": {
                    "num_cpus": resources.num_cpus,
                    "num_gpus": resources.num_gpus,
                },
                "init_args": init_args,
            },
        )
    except RunInterrupted:
        stop_engine()
        raise
    if not summaries:
        raise RuntimeError(
            "the simulation finished without writing a summary: see the log above for the "
            "server's error"
        )
    return summaries[-1]


def _simulate_in_runtime(
    overrides: dict[str, Any],
    fleet: list[NodeSettings],
    resources: NodeResources,
    backend: str,
    ray_address: str | None,
) -> dict[str, Any]:
    """Flower's Simulation Runtime (``run_in_runtime``): its own SuperLink, ``flwr run``,
    the run's log relayed here; it stops everything it started, also when interrupted."""
    from simulations.runtime import RuntimeOptions, run_in_runtime

    options = RuntimeOptions(
        num_nodes=len(fleet), resources=resources, ray_address=ray_address, backend=backend
    )
    result = run_in_runtime(overrides, options)
    return result.summary


# ----------------------------------------------------------------------------- signals


class RunInterrupted(KeyboardInterrupt):
    """A run ended by a signal (SIGINT, SIGTERM, SIGHUP), raised in the main thread.

    A KeyboardInterrupt, so Flower's and the studies' ``except Exception`` let it through.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        """The shell's convention: 128 + the signal's number (130, 143, 129)."""
        return 128 + self.signum


_handlers_lock = threading.Lock()
_installed: dict[int, Any] = {}  # signal -> the handler found before ours
_interrupted: list[int] = []
#: ``interruptible(last_words=...)``: the line a second signal prints when it ends the
#: process at once (the first one's clean-up cut short), once the engine is killed.
_last_words: list[Callable[[int], str]] = []
#: The real stderr while ``_quiet`` points file descriptor 2 at /dev/null.
_real_stderr_fd: list[int] = []


def _on_stop_signal(signum: int, frame: FrameType | None) -> None:
    if _interrupted:  # a second signal while the first one's clean-up runs: end now
        kill_descendants(grace_s=0.0)
        _say_last_words(_interrupted[0])
        os._exit(128 + signum)
    _interrupted.append(signum)
    # A ServerApp thread winding down writes no summary.json. The module may be half
    # imported (the signal came during its import, before it has the event): no ServerApp
    # of this process runs then.
    stopped = getattr(sys.modules.get("fl_server.results"), "RUN_STOPPED", None)
    if stopped is not None:
        stopped.set()
    raise RunInterrupted(signum)


def _say_last_words(signum: int) -> None:
    if not _last_words:
        return
    fd = _real_stderr_fd[-1] if _real_stderr_fd else 2
    with contextlib.suppress(Exception):  # ending at once: a line that fails is no reason to stay
        os.write(fd, (_last_words[-1](signum) + "\n").encode())


def reinstall_handlers() -> None:
    """Put our handlers back where a library replaced them (``ray.init`` sets its own
    SIGTERM handler, which exits with status 1 and no word)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _handlers_lock:
        for signum in _installed:
            if signal.getsignal(signum) is not _on_stop_signal:
                signal.signal(signum, _on_stop_signal)


@contextlib.contextmanager
def interruptible(last_words: Callable[[int], str] | None = None) -> Iterator[None]:
    """Inside the block, SIGINT, SIGTERM and SIGHUP raise ``RunInterrupted`` in the main
    thread (once; a second signal ends the process at once, engine included, after
    printing ``last_words(first signal)`` when given: what was stopped, what is kept; it
    may tidy up first, the engine being gone by then).

    A signal the process was told to ignore (``nohup``, a background job without job
    control) stays ignored. Outside the main thread this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if last_words is not None:
        _last_words.append(last_words)
    with _handlers_lock:
        for signum in STOP_SIGNALS:
            previous = signal.getsignal(signum)
            if previous == signal.SIG_IGN or signum in _installed:
                continue
            _installed[signum] = previous
            signal.signal(signum, _on_stop_signal)
    _interrupted.clear()
    try:
        yield
    finally:
        with _handlers_lock:
            for signum, previous in list(_installed.items()):
                signal.signal(signum, previous)
                del _installed[signum]
        if last_words is not None:
            _last_words.remove(last_words)


def start_ray(init_args: dict[str, Any]) -> None:
    """Start Ray here as Flower's Ray backend would (it skips ``ray.init`` when Ray runs),
    then put back our signal handlers, which ``ray.init`` replaces."""
    import ray

    if not ray.is_initialized():
        # Ray's workers import the app: they get this process's import path, as Flower does.
        pythonpath = os.pathsep.join(sys.path)
        if os.environ.get("PYTHONPATH"):
            pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
        os.environ["PYTHONPATH"] = pythonpath
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **init_args)
    reinstall_handlers()


def stop_engine(timeout_s: float = 10.0) -> None:
    """End the simulation engine: Ray's shutdown (bounded by ``timeout_s``), then any
    process this one started that is still alive. Quiet: the engine's threads, left
    without workers, would otherwise log errors about the run being stopped."""
    for name in ("flwr", "ray"):
        logging.getLogger(name).disabled = True
    ray = sys.modules.get("ray")
    with _quiet():
        if ray is not None:

            def shutdown() -> None:
                with contextlib.suppress(Exception):
                    if ray.is_initialized():
                        ray.shutdown()

            worker = threading.Thread(target=shutdown, name="powerfl-ray-shutdown", daemon=True)
            worker.start()
            worker.join(timeout_s)
        kill_descendants()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """stdout and stderr (the file descriptors, which Ray's C++ core and its log relay
    write to) go to /dev/null inside the block."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    _real_stderr_fd.append(saved[1])
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        _real_stderr_fd.remove(saved[1])
        for fd in (*saved, devnull):
            os.close(fd)


def kill_descendants(grace_s: float = 3.0) -> None:
    """SIGTERM every process below this one (again for any that appears meanwhile, e.g. a
    dying raylet's workers), then SIGKILL those still alive after ``grace_s``
    (``processes.terminate``), and reap the ones that were our own children."""
    for pid in terminate(lambda _seen: descendants(), grace_s):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
