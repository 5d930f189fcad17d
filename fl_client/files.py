"""Files a node or the server writes: atomically, and a bad one set aside, never deleted."""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path


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
