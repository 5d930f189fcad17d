"""A finished cell's record against what its cell runs with now.

A cell's key covers its overrides of the run defaults (``[tool.flwr.app.config]``), not the
defaults themselves. When a default changes, a record made before the change still has its
cell's key, but its cell would now run with another value: reusing it would report the old
behaviour under the new name. ``drift`` finds such a record from its run's ``settings.json``
(every run setting as the run resolved it), comparing only what the run reads
(``fl_client.effective.unread_keys``) and leaving out where the run wrote its files.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fl_client.contract import key_of, to_record
from fl_client.effective import unread_keys
from fl_client.settings import RunSettings

#: Run settings that say where a run reads or writes, not what it computes (``fleet``: the
#: fleet file's content is part of the key)
WHERE_KEYS = frozenset(
    {"fleet", "output-dir", "cache-dir", "run-dir", "simulated-fleet", "tracking", "tracking-uri"}
)


def drift(record: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The run settings whose value in ``record``'s run (its ``settings.json``) differs from
    the value its cell resolves to now (``settings``: the cell's overrides), as kebab-case
    key -> (then, now), for the settings both runs read. Empty where the record's run folder
    is not at hand (records copied without their runs cannot be checked)."""
    run_dir = record.get("run-dir")
    path = Path(str(run_dir)) / "settings.json" if run_dir else None
    if path is None or not path.is_file():
        return {}
    then = {key_of(k): v for k, v in json.loads(path.read_text(encoding="utf-8")).items()}
    resolved = RunSettings.from_config(dict(settings))
    now = {key_of(k): v for k, v in json.loads(json.dumps(to_record(vars(resolved)))).items()}
    # what the record's run read: its own method, aggregation, balance and tracking
    read_by = ("method", "aggregation", "balance", "tracking")
    past = dataclasses.replace(
        resolved, **{k: then[k] for k in read_by if isinstance(then.get(k), str)}
    )
    skip = WHERE_KEYS | unread_keys(resolved, resolved.method) | unread_keys(past, past.method)
    both = sorted(now.keys() & then.keys() - skip)
    return {k: (then[k], now[k]) for k in both if then[k] != now[k]}
