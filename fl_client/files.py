"""Files a node or the server writes: atomically, and a bad one set aside, never deleted."""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from fl_client.contract import SettingsError


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and
    ``os.replace``, so a reader never sees half a file; returns the path. The file gets the
    usual permissions (0666 less the umask), not ``mkstemp``'s 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def set_aside(path: Path) -> str:
    """Rename a corrupt or mismatching file to ``<name>.corrupt-<UTC time>`` (kept for a
    look, never read again); returns what happened, for the warning."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    try:
        path.rename(aside)
    except OSError as err:
        return f"could not be set aside ({err})"
    return f"kept as {aside.name}"


#: The file by which a run owns its folder while it runs (its starter's PID inside).
RUN_LOCK = "run.lock"
#: Records only one run may write into a folder.
RUN_RECORDS = ("summary.json", "rounds.jsonl")


class RunFolderError(SettingsError):
    """A run folder another run owns, or that already holds another run's records."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def check_run_records(path: Path, key: str = "run-dir") -> None:
    """Refuse a folder that already holds a run's records (``RUN_RECORDS``): a run owns
    its folder, so two runs never write one ``rounds.jsonl``."""
    for name in RUN_RECORDS:
        if (path / name).exists():
            raise RunFolderError(
                f"{key}: {path} already holds another run's records ({name}); a run owns its "
                f"folder: name a new folder or leave {key} out"
            )


def claim_run_folder(path: str | os.PathLike[str], key: str = "run-dir") -> Path:
    """Make ``path`` this process's run folder: created if missing, refused if it holds
    another run's records or a live run's lock (``RUN_LOCK``, taken atomically); a lock
    left by a process that is gone is taken over. ``release_run_folder`` gives it back."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    check_run_records(folder, key)
    lock = folder / RUN_LOCK
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = int(lock.read_text(encoding="utf-8").split()[0])
            except (OSError, ValueError, IndexError):
                owner = 0
            if owner and owner != os.getpid() and _pid_alive(owner):
                raise RunFolderError(
                    f"{key}: {folder} belongs to a run in progress (process {owner}, "
                    f"{RUN_LOCK}); a run owns its folder: name a new folder or leave {key} out"
                ) from None
            lock.unlink(missing_ok=True)  # left by a run that is gone
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()} {datetime.now(timezone.utc).isoformat()}\n")
        return folder
    raise RunFolderError(f"{key}: could not take {lock}; try again")


def release_run_folder(path: str | os.PathLike[str]) -> None:
    """Remove this process's lock from the run folder (nothing if another owns it)."""
    lock = Path(path) / RUN_LOCK
    try:
        if int(lock.read_text(encoding="utf-8").split()[0]) == os.getpid():
            lock.unlink()
    except (OSError, ValueError, IndexError):
        pass
