"""A finished cell's record against what its cell runs with now.

A cell's key covers its overrides of the run defaults (``[tool.flwr.app.config]``), not the
defaults themselves. When a default changes, a record made before the change still has its
cell's key, but its cell would now run with another value: reusing it would report the old
behaviour under the new name. ``drift`` finds such a record from its run's ``settings.json``
(every run setting as the run resolved it), comparing only what the run reads
(``fl_client.effective.unread_keys``) and leaving out where the run wrote its files.

A key added since a record was made is not in its ``settings.json``; its run had the
behaviour from before the key. ``update-budget`` (``fedbuff``): the run had the fleet's
budget, and it is the run ``each-node`` gives (the default) only where it reached its target
before every node's ``num-rounds``-th update was applied (``_stops_alike``, from its
``updates.jsonl``); a run that stopped on its budget drifts, and its cell runs again.

The other way round, a cell without a record at its key (its overrides now spell out a
value its run resolved anyway, e.g. a default about to change) may have one of the study's
records under another key whose run resolved what the cell resolves to now:
``runs_by_identity`` indexes the study's records by their run's method, seed, cell version
and fleet text, each read once, keeping those whose run's ``settings.json`` is at hand (the
only evidence of what the run resolved); a candidate without ``drift`` is the cell's run.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from fl_client.contract import key_of, to_record
from fl_client.effective import unread_keys
from fl_client.settings import RunSettings
from strategies.fedbuff import UpdateBudget

#: Run settings that say where a run reads or writes, not what it computes (``fleet``: the
#: fleet file's content is part of the key)
WHERE_KEYS = frozenset(
    {"fleet", "output-dir", "cache-dir", "run-dir", "simulated-fleet", "tracking", "tracking-uri"}
)


#: What a record's run was beside its settings: (method, seed, cell version, fleet text).
Identity = tuple[Any, Any, Any, Any]


def run_settings(record: Mapping[str, Any]) -> Path | None:
    """``record``'s run's ``settings.json`` (in its ``run-dir``), if it is at hand."""
    run_dir = record.get("run-dir")
    path = Path(str(run_dir)) / "settings.json" if run_dir else None
    return path if path is not None and path.is_file() else None


def identity(record: Mapping[str, Any]) -> Identity:
    """What ``record``'s run was beside its settings (``Identity``)."""
    get = record.get
    return (get("method"), get("seed"), get("cell-version"), get("fleet-text"))


def runs_by_identity(
    folder: Path, wanted: Collection[Identity]
) -> dict[Identity, list[tuple[str, dict[str, Any]]]]:
    """The records under ``folder`` (``*.json``, and those set aside, ``*.json.stale-*``: a
    record set aside because its own cell now resolves otherwise is still the record of
    what its run resolved, which another cell may resolve to now) whose ``identity`` is one
    of ``wanted`` and whose run's ``settings.json`` is at hand, as identity -> [(file name,
    record)] in file-name order; each file read once, one that does not parse left out."""
    found: dict[Identity, list[tuple[str, dict[str, Any]]]] = {}
    for path in sorted([*folder.glob("*.json"), *folder.glob("*.json.stale-*")]):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, OSError):
            continue
        if not isinstance(record, dict) or identity(record) not in wanted:
            continue
        if run_settings(record) is not None:
            found.setdefault(identity(record), []).append((path.name, record))
    return found


def drift(record: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The run settings whose value in ``record``'s run (its ``settings.json``) differs from
    the value its cell resolves to now (``settings``: the cell's overrides), as kebab-case
    key -> (then, now), for the settings both runs read. Empty where the record's run folder
    is not at hand (records copied without their runs cannot be checked)."""
    path = run_settings(record)
    if path is None:
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
    out = {k: (then[k], now[k]) for k in both if then[k] != now[k]}
    budget = "update-budget"
    # made before the key: the run had the fleet's budget, the same run as each-node's only
    # if it reached its target before each node's num-rounds-th update was applied
    if (
        budget not in then
        and budget not in skip
        and now[budget] != "fleet"
        and not _stops_alike(record, path.parent / "updates.jsonl", int(then["num-rounds"]))
    ):
        out[budget] = ("fleet", now[budget])
    return out


def _stops_alike(record: Mapping[str, Any], updates: Path, rounds: int) -> bool:
    """Whether a ``fedbuff`` run made before ``update-budget`` (with the fleet's budget)
    stopped where ``each-node`` would have: it reached its target (the summary's
    ``round-to-target``, a version) and no version before it had every node's ``rounds``-th
    trained update applied (``updates.jsonl``; every node that sent one counts)."""
    version = (record.get("summary") or {}).get("round-to-target")
    if version is None or not updates.is_file():
        return False  # it stopped on its budget, or its updates cannot be read
    trained: dict[str, int] = {}
    lines = [json.loads(line) for line in updates.read_text(encoding="utf-8").splitlines()]
    nodes = {str(u["node"]) for u in lines}
    done = sorted(
        (int(u["version"]), str(u["node"]))
        for u in lines
        if u["version"] is not None and u["choice"] != "profiling"
    )
    each_node = UpdateBudget("each-node", rounds, 0)
    for applied, node in done:
        if applied >= int(version):
            break
        trained[node] = trained.get(node, 0) + 1
        if each_node.spent(applied, trained, nodes):
            return False  # each-node's budget was spent before the target
    return True
