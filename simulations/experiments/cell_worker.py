"""Run many simulation cells in one long-lived worker process (Flower's in-process engine).

A cell run through the Simulation Runtime (``federated.run_in_child``) pays, every time, a
fresh interpreter that loads PyTorch and the app, a SuperLink, a SuperExec and a
``flwr-simulation`` process that load them again, and a private Ray. ``CellWorker`` keeps
one spawned process (its own process group) that has loaded the app once and runs one cell
after another with ``simulations.run.simulate(…, engine="in-process")``: Flower's
``run_simulation`` in that process, which starts (and at the run's end stops) Ray itself.

With ``warm``, the worker also keeps Flower's Ray engine between cells
(``keep_engine_warm``): Flower's Ray backend ends its actor pool and Ray after every run,
so every run would start Ray and actors that load PyTorch and the app again; the warm
worker keeps Ray up and hands the next run the same idle actors. A simulated node's state
lives in its run's cache folder and Flower's per-run context, never in the actor's process
(one actor already serves many nodes in a run, one after another), so a warm actor serves
a new run as a fresh one would. A run that fails drops the pool; the next builds a new one.

Each cell's output goes to its own ``simulate.log`` and its summary to ``result.json``,
exactly as ``federated.run_in_child`` writes them, so ``federated.run_cell`` reads either.
A cell that runs past its timeout ends the worker and everything it started (its process
group); the next cell starts a fresh worker.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulations.experiments.records import write_json


def _redirect(log_path: Path) -> None:
    """This process's stdout and stderr (the descriptors: Ray's log relay writes to them)
    append to ``log_path``."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def simulate_in_process(overrides: dict[str, Any]) -> dict[str, Any]:
    """``simulations.run.simulate`` with Flower's in-process engine: the worker's default."""
    from simulations.run import simulate

    return simulate(overrides, engine="in-process")


Simulate = Callable[[dict[str, Any]], dict[str, Any]]

#: The warm engine's actor pool and the resources it was built with (worker process only).
_WARM: dict[str, Any] = {}


def keep_engine_warm() -> bool:
    """Make Flower's Ray backend (``RayBackend``) keep its actors and Ray after a run and
    reuse them, all idle, in the next run of this process with the same resources; False
    (nothing changed) where the installed Flower has no such backend."""
    try:
        from flwr.server.superlink.fleet.vce.backend import raybackend
    except ImportError:
        return False
    cls = raybackend.RayBackend
    if getattr(cls, "_powerfl_warm", False):
        return True
    if not all(hasattr(cls, name) for name in ("build", "terminate")):
        return False
    cold_build, cold_terminate = cls.build, cls.terminate

    def build(self: Any, app_fn: Any) -> None:
        pool = _WARM.get("pool")
        idle = pool is not None and pool.num_actors > 0 and len(pool.pool) == pool.num_actors
        if idle and _WARM.get("resources") == self.client_resources:
            self.pool, self.app_fn = pool, app_fn
            return
        drop_warm_engine()
        cold_build(self, app_fn)
        _WARM.update(pool=self.pool, resources=dict(self.client_resources), end=cold_terminate)

    def terminate(self: Any) -> None:  # the actors and Ray stay for the next run
        if self.pool is not _WARM.get("pool"):
            cold_terminate(self)

    setattr(cls, "build", build)  # noqa: B010 (a method replaced on Flower's class)
    setattr(cls, "terminate", terminate)  # noqa: B010
    setattr(cls, "_powerfl_warm", True)  # noqa: B010
    return True


def drop_warm_engine() -> None:
    """End the warm actor pool (and Ray) if there is one."""
    pool, end = _WARM.pop("pool", None), _WARM.pop("end", None)
    _WARM.pop("resources", None)
    if pool is not None and end is not None:
        holder = type("Backend", (), {})()
        holder.pool = pool
        with contextlib.suppress(Exception):
            end(holder)


def _serve(conn: Any, simulate: Simulate, warm: bool) -> None:
    """The worker: run each ``(overrides, work)`` it is sent, answer ``(ok, why)``; None ends it."""
    from simulations.run import flower_env, interruptible

    os.setsid()  # its own process group: a timeout ends the engine's processes with it
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    flower_env(Path.cwd() / ".flwr")
    if warm:
        keep_engine_warm()
    with interruptible():
        while True:
            job = conn.recv()
            if job is None:
                drop_warm_engine()
                return
            overrides, work = job
            _redirect(Path(work) / "simulate.log")
            try:
                summary = simulate(overrides)
                write_json(Path(work) / "result.json", summary)
                conn.send((True, ""))
            except Exception as exc:  # the cell failed; the worker serves the next one
                traceback.print_exc()
                sys.stderr.flush()
                drop_warm_engine()  # its actors may hold the failed run's work
                conn.send((False, f"{type(exc).__name__}: {exc}".splitlines()[0]))


class CellWorker:
    """A spawned worker process that runs cells with the in-process engine, one at a time;
    ``run`` has the signature of ``federated.run_in_child`` without its ``simulate``, which
    is given here (a module-level function: the spawned worker imports it by name)."""

    def __init__(self, simulate: Simulate = simulate_in_process, *, warm: bool = False) -> None:
        self.simulate, self.warm = simulate, warm
        self.proc: Any = None
        self.conn: Any = None
        self.cells_run = 0  # by the current process

    @property
    def engine(self) -> str:
        """How the worker runs its cells, as the studies record it: ``in-process-warm``
        (Ray and its actors kept from one cell to the next) or ``in-process``."""
        return "in-process-warm" if self.warm else "in-process"

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve, args=(child, self.simulate, self.warm), name="powerfl-cell-worker"
        )
        self.proc.start()
        child.close()
        self.cells_run = 0

    def run(
        self,
        overrides: dict[str, Any],
        work: Path,
        timeout_s: float,
        on_line: Callable[[str], None] | None = None,
    ) -> tuple[dict[str, Any] | None, str]:
        """Run one cell (``simulate(overrides)``) in the worker, its output in
        ``work/simulate.log``; (its summary or None, why there is none)."""
        from simulations.experiments.federated import LogTail

        log_path, result_path = work / "simulate.log", work / "result.json"
        log_path.write_text(
            "# run settings:\n" + json.dumps(overrides, indent=1) + "\n", encoding="utf-8"
        )
        result_path.unlink(missing_ok=True)
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send((overrides, str(work)))
        deadline = time.perf_counter() + timeout_s
        tail = LogTail(log_path, on_line)
        answer: tuple[bool, str] | None = None
        try:
            while time.perf_counter() < deadline and self.proc.is_alive():
                if self.conn.poll(0.5):
                    answer = self.conn.recv()
                    break
                tail.feed()
            tail.feed()
        except (EOFError, OSError):  # the worker died mid-cell
            answer = None
        finally:
            tail.close()
        self.cells_run += 1
        if answer is None:
            timed_out = self.proc.is_alive()
            self.close(force=True)
            return None, "timed out" if timed_out else f"worker exit status {self.proc.exitcode}"
        ok, why = answer
        if not ok or not result_path.is_file():
            return None, why or "no summary written"
        return json.loads(result_path.read_text(encoding="utf-8")), ""

    def close(self, force: bool = False) -> None:
        """End the worker: ask it to stop, else (or with ``force``) end its process group."""
        from simulations.experiments.federated import stop_process

        if self.proc is None:
            return
        if not force and self.proc.is_alive():
            with contextlib.suppress(Exception):
                self.conn.send(None)
            self.proc.join(30)
        if self.proc.is_alive():
            stop_process(self.proc)
        with contextlib.suppress(Exception):
            self.conn.close()
