"""Raw records of an experiment: one JSON file per finished cell, written atomically.

A record carries the ``key`` (sha256 of every input it depends on); a record whose key
does not match, or that does not parse, is set aside (``<name>.stale-<UTC stamp>``) and the
cell is computed again. That makes a run resumable: rerunning the same command skips every
cell whose record is on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fl_client.contract import to_record
from fl_client.files import write_atomic

log = logging.getLogger(__name__)


def digest(payload: Any) -> str:
    """sha256 (hex) of a JSON-serialisable payload (keys sorted)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as standard JSON (NaN/inf as null), atomically, with the usual umask."""
    write_atomic(path, json.dumps(to_record(data), indent=1, allow_nan=False) + "\n")


def read_record(path: Path, key: str) -> dict[str, Any] | None:
    """The record at ``path`` if it exists, parses and has ``key``; else None (set aside)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("key") != key:
            raise ValueError("key does not match the current settings")
        return data
    except (ValueError, OSError) as exc:
        set_aside(path, str(exc))
        return None


def set_aside(path: Path, why: str, *, state: str = "is stale or corrupt") -> None:
    """Move a record out of the way (``<name>.stale-<UTC time>``), saying what it ``state``
    and why: a stale or corrupt one (its cell runs again), or one another cell adopted."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    aside = path.with_name(f"{path.name}.stale-{stamp}")
    log.warning("record %s %s (%s): moved to %s", path, state, why, aside.name)
    with contextlib.suppress(OSError):
        path.replace(aside)


def load_all(folder: Path) -> list[dict[str, Any]]:
    """Every ``*.json`` record under ``folder`` (sorted by path)."""
    if not folder.is_dir():
        return []
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.rglob("*.json"))]
