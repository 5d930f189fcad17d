"""Put back the GPU settings a backend changed: state files, signal and exit handlers.

Before a backend changes a GPU setting for the first time it writes the settings it found to
a state file (one per GPU). ``restore()`` puts them back and removes the file. Whatever ends
the process, the settings come back:

* an exception or a normal exit: context managers, ``close()`` and an ``atexit`` hook;
* SIGTERM, SIGINT, SIGHUP: a handler hands the signal to the handler that was there before
  and restores only what that ends: with the default action (the process dies by the
  signal) every device, before dying; with a Python handler that raises (KeyboardInterrupt,
  ``powerfl``'s interrupt) the devices locked from the main thread, whose training step the
  exception unwinds; with a handler that returns (the process goes on) nothing. A signal
  the process ignores at start (SIG_IGN, e.g. SIGHUP under ``nohup``) gets no handler, so it
  never unlocks a GPU under a training step that keeps running;
* SIGKILL or power loss: nothing runs, but the state file stays; the next open of the same
  GPU (or ``powerfl devices --restore``) puts the settings back from it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import itertools
import json
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from fl_client.devices.base import DeviceError

log = logging.getLogger(__name__)

STATE_DIR_ENV = "POWERFL_STATE_DIR"
STATE_SUFFIX = ".json"
# Backends whose module exposes ``restore_saved_settings(settings)`` for leftover files.
RESTORER_MODULES = {
    "jetson": "fl_client.devices.jetson",
    "nvml": "fl_client.devices.nvml",
}
HANDLED_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)
_BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def default_state_dir() -> Path:
    """``$POWERFL_STATE_DIR`` if set, else ``~/.cache/powerfl/state``."""
    env = os.environ.get(STATE_DIR_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "powerfl" / "state"


def resolve_state_dir(state_dir: str | os.PathLike[str] | None) -> Path:
    return Path(state_dir).expanduser() if state_dir is not None else default_state_dir()


def boot_id() -> str | None:
    """This boot's id: a state file from an earlier boot belongs to no living process."""
    try:
        return _BOOT_ID_PATH.read_text().strip() or None
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True


@dataclass(frozen=True)
class SavedState:
    """What a state file holds: the settings found before the first change, and its owner."""

    path: Path
    backend: str
    device_id: str
    settings: dict[str, Any]
    pid: int
    boot_id: str | None
    created_s: float

    def owner_alive(self) -> bool:
        """Whether the process that wrote the file may still hold the GPU."""
        current_boot = boot_id()
        if self.boot_id and current_boot and self.boot_id != current_boot:
            return False
        return pid_alive(self.pid)


def state_path(state_dir: Path, backend: str, device_id: str) -> Path:
    """One file per GPU: ``<backend>-<device id with path separators replaced>.json``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in device_id.strip("/"))
    return state_dir / f"{backend}-{safe}{STATE_SUFFIX}"


def save_state(state_dir: Path, backend: str, device_id: str, settings: Mapping[str, Any]) -> Path:
    """Write the original settings atomically (temp file + rename) and return the path."""
    path = state_path(state_dir, backend, device_id)
    payload = {
        "backend": backend,
        "device-id": device_id,
        "settings": dict(settings),
        "pid": os.getpid(),
        "boot-id": boot_id(),
        "created-s": time.time(),
    }
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=state_dir)
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise DeviceError(
            f"cannot write the GPU state file {path} ({err.strerror or err}): the original "
            f"settings must be saved before changing them; set {STATE_DIR_ENV} to a "
            "writable folder"
        ) from None
    return path


def load_state(path: Path) -> SavedState:
    """Read a state file; a corrupt one raises DeviceError naming the file."""
    try:
        data = json.loads(path.read_text())
        return SavedState(
            path=path,
            backend=str(data["backend"]),
            device_id=str(data["device-id"]),
            settings=dict(data["settings"]),
            pid=int(data.get("pid", -1)),
            boot_id=data.get("boot-id"),
            created_s=float(data.get("created-s", 0.0)),
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DeviceError(
            f"corrupt GPU state file {path}: {err}; check the GPU's frequency settings "
            "(e.g. `powerfl devices`), then delete the file"
        ) from None


def clear_state(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def leftover_states(state_dir: Path) -> list[Path]:
    if not state_dir.is_dir():
        return []
    return sorted(p for p in state_dir.glob(f"*{STATE_SUFFIX}") if p.is_file())


@dataclass(frozen=True)
class RestoreReport:
    """What ``restore_leftovers`` did with one state file."""

    path: Path
    backend: str
    device_id: str
    status: str  # "restored" | "held" (owner still running) | "failed"
    detail: str = ""


def restore_saved(state: SavedState) -> None:
    """Put back the settings of one state file through its backend, then remove the file."""
    module_name = RESTORER_MODULES.get(state.backend)
    if module_name is None:
        raise DeviceError(
            f"state file {state.path}: unknown backend {state.backend!r}; "
            f"known: {', '.join(RESTORER_MODULES)}"
        )
    module = importlib.import_module(module_name)
    module.restore_saved_settings(state.settings)
    clear_state(state.path)
    log.warning(
        "restored %s GPU settings left by process %d in %s",
        state.backend,
        state.pid,
        state.path,
    )


def restore_leftovers(
    state_dir: str | os.PathLike[str] | None = None, *, force: bool = False
) -> list[RestoreReport]:
    """Restore every leftover state file in ``state_dir`` (``powerfl devices --restore``).

    A file whose owner still runs (same boot, live pid other than this process) is left
    alone unless ``force``: that process holds the GPU and will restore it itself.
    """
    reports: list[RestoreReport] = []
    for path in leftover_states(resolve_state_dir(state_dir)):
        try:
            state = load_state(path)
        except DeviceError as err:
            reports.append(RestoreReport(path, "?", "?", "failed", str(err)))
            continue
        if not force and state.pid != os.getpid() and state.owner_alive():
            reports.append(
                RestoreReport(
                    path,
                    state.backend,
                    state.device_id,
                    "held",
                    f"process {state.pid} still runs and holds this GPU",
                )
            )
            continue
        try:
            restore_saved(state)
        except DeviceError as err:
            reports.append(RestoreReport(path, state.backend, state.device_id, "failed", str(err)))
        else:
            reports.append(RestoreReport(path, state.backend, state.device_id, "restored"))
    return reports


class GpuStateRecord:
    """The state file and exit hooks of one GPU while a backend has its settings changed."""

    def __init__(self, state_dir: str | os.PathLike[str] | None, backend: str, device_id: str):
        self.backend = backend
        self.device_id = device_id
        self.state_dir = resolve_state_dir(state_dir)
        self.path = state_path(self.state_dir, backend, device_id)
        self._token: int | None = None

    @property
    def active(self) -> bool:
        """Whether settings are changed now (state saved, hooks registered)."""
        return self._token is not None

    def begin(self, settings: Mapping[str, Any], restore: Callable[[], None]) -> None:
        """Before the first change: save the original settings and register ``restore``."""
        if self._token is None:
            save_state(self.state_dir, self.backend, self.device_id, settings)
            self._token = register(restore)

    def end(self) -> None:
        """After restoring: remove the state file and the hooks."""
        clear_state(self.path)
        unregister(self._token)
        self._token = None

    def leftover(self) -> SavedState | None:
        """A state file of this GPU left by an earlier run (or by this process), if any.

        Raises DeviceError when another live process holds the GPU.
        """
        if not self.path.exists():
            return None
        state = load_state(self.path)
        if state.pid != os.getpid() and state.owner_alive():
            raise DeviceError(
                f"{self.backend}: process {state.pid} holds the settings of GPU "
                f"{self.device_id} (state file {self.path}); stop it first, or if it is not "
                "powerfl, run `powerfl devices --restore --force`"
            )
        return state


# ---------------------------------------------------------------- active devices, handlers

_lock = threading.RLock()
_active: dict[int, tuple[Callable[[], None], int]] = {}  # token -> (restore, thread id)
_tokens = itertools.count(1)
_previous_handlers: dict[int, Any] = {}
_atexit_installed = False


def register(restore: Callable[[], None]) -> int:
    """Call ``restore`` on exit and on SIGTERM/SIGINT/SIGHUP (see the module's docstring for
    which signal restores what) until ``unregister(token)``. The calling thread is the one
    whose training step runs under the changed settings."""
    with _lock:
        token = next(_tokens)
        _active[token] = (restore, threading.get_ident())
    install_handlers()
    return token


def unregister(token: int | None) -> None:
    if token is not None:
        with _lock:
            _active.pop(token, None)


def active_count() -> int:
    with _lock:
        return len(_active)


def restore_all(thread_id: int | None = None) -> None:
    """Restore every registered device (only those registered from ``thread_id`` if given);
    one failure does not stop the others."""
    with _lock:
        restorers = [r for r, tid in _active.values() if thread_id in (None, tid)]
    for restore in restorers:
        try:
            restore()
        except Exception:  # a handler must not die half way: log and go on
            log.exception("restoring GPU settings failed")


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """Restore only what the signal ends (the module's docstring), then let it act."""
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if previous == signal.SIG_IGN:
        return  # the process goes on, and so may its training: restore nothing
    if callable(previous):
        try:
            previous(signum, frame)
        except BaseException:  # it ends the main thread's step: restore what that step held
            restore_all(threading.main_thread().ident)
            raise
        return  # handled and going on: the devices stay as the running step needs them
    # default action (or a handler set outside Python): die by the signal, devices restored
    restore_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_handlers() -> None:
    """Install the atexit hook and, from the main thread, the signal handlers (once each).

    A signal ignored at this point (SIG_IGN: ``nohup``, a background job) keeps being
    ignored: it gets no handler, so it cannot restore a device while training goes on.
    """
    global _atexit_installed
    with _lock:
        if not _atexit_installed:
            atexit.register(restore_all)
            _atexit_installed = True
        for signum in HANDLED_SIGNALS:
            if signum in _previous_handlers:
                continue
            try:
                previous = signal.getsignal(signum)
                if previous == signal.SIG_IGN:
                    continue
                signal.signal(signum, _on_signal)
            except ValueError:
                # Not the main thread: the atexit hook and the state file still cover us.
                log.info(
                    "GPU settings: no signal handlers outside the main thread; a kill is "
                    "covered by the state file (restored at next open or `powerfl devices "
                    "--restore`)"
                )
                return
            _previous_handlers[signum] = previous


def uninstall_handlers() -> None:
    """Put back the signal handlers found by ``install_handlers`` (main thread only)."""
    with _lock:
        for signum, previous in list(_previous_handlers.items()):
            try:
                signal.signal(signum, previous)
            except (ValueError, TypeError):
                continue
            del _previous_handlers[signum]
