"""A SuperLink of the run's own in simulation mode on 127.0.0.1 (``LocalSuperLink``) and
the ``flwr`` commands that talk to it, ``flwr run --stream`` (``RunStream``) among them:
every process they start is followed and stopped by PID (``stop_tree``), and the run's
log is relayed with Flower's own start-up notes left out. ``simulations.runtime`` runs a
simulation through them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
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

from simulations.processes import alive, process_tree, terminate

#: Quiet, offline Flower in every process of the run (``simulations.run.flower_env`` sets
#: them in ``powerfl``'s own process too).
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
#: The name of the connection to the run's own SuperLink in its ``$FLWR_HOME``.
CONNECTION = "powerfl-runtime"
#: Seconds: SuperLink start-up, a ``flwr`` command.
STARTUP_TIMEOUT_S = 90.0
CLI_TIMEOUT_S = 120.0
#: Lines of the run's log kept for an error message.
TAIL_LINES = 60
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
