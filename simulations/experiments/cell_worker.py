"""Run many simulation cells in one long-lived worker process (Flower's in-process engine).

A cell run through the Simulation Runtime (``federated.run_in_child``) pays, every time, a
fresh interpreter that loads PyTorch and the app, a SuperLink, a SuperExec and a
``flwr-simulation`` process that load them again, and a private Ray. ``CellWorker`` keeps
one spawned process (its own process group) that has loaded the app once and runs one cell
after another with ``simulations.run.simulate(…, engine="in-process")``: Flower's
``run_simulation`` in that process, which starts (and at the run's end stops) Ray itself.

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


def _serve(conn: Any, simulate: Simulate) -> None:
    """The worker: run each ``(overrides, work)`` it is sent, answer ``(ok, why)``; None ends it."""
    from simulations.run import flower_env, interruptible

    os.setsid()  # its own process group: a timeout ends the engine's processes with it
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    flower_env(Path.cwd() / ".flwr")
    with interruptible():
        while True:
            job = conn.recv()
            if job is None:
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
                conn.send((False, f"{type(exc).__name__}: {exc}".splitlines()[0]))


class CellWorker:
    """A spawned worker process that runs cells with the in-process engine, one at a time;
    ``run`` has the signature of ``federated.run_in_child`` without its ``simulate``, which
    is given here (a module-level function: the spawned worker imports it by name)."""

    def __init__(self, simulate: Simulate = simulate_in_process) -> None:
        self.simulate = simulate
        self.proc: Any = None
        self.conn: Any = None
        self.cells_run = 0  # by the current process

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve, args=(child, self.simulate), name="powerfl-cell-worker"
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
        from simulations.experiments.federated import _LogTail

        log_path, result_path = work / "simulate.log", work / "result.json"
        log_path.write_text(
            "# run settings:\n" + json.dumps(overrides, indent=1) + "\n", encoding="utf-8"
        )
        result_path.unlink(missing_ok=True)
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self.conn.send((overrides, str(work)))
        deadline = time.perf_counter() + timeout_s
        tail = _LogTail(log_path, on_line)
        answer: tuple[bool, str] | None = None
        try:
            while time.perf_counter() < deadline and self.proc.is_alive():
                if self.conn.poll(0.5):
                    answer = self.conn.recv()
                    break
                tail.feed()
            tail.feed()
        except EOFError:  # the worker died mid-cell
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
        from simulations.experiments.federated import _stop

        if self.proc is None:
            return
        if not force and self.proc.is_alive():
            with contextlib.suppress(Exception):
                self.conn.send(None)
            self.proc.join(30)
        if self.proc.is_alive():
            _stop(self.proc)
        with contextlib.suppress(Exception):
            self.conn.close()
