"""A finished cell's record against the settings its cell runs with now
(``simulations.experiments.settings_drift``, ``federated.pending``): a record made before a
default changed is found by its run's ``settings.json`` and set aside; what the run does not
read, and where it wrote its files, never counts. A cell without a record at its key adopts
one under another key whose run resolved what the cell resolves to now."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fl_client.contract import to_record
from fl_client.settings import RunSettings
from simulations.experiments.federated import Cell, pending, record_path
from simulations.experiments.federated_config import CELL_VERSION
from simulations.experiments.settings_drift import drift

#: B1: ``aggregation = "auto"`` resolves to fedavg for it
SETTINGS = {"method": "b1", "seed": 1, "num-rounds": 2}


def _record(tmp_path: Path, settings: dict[str, Any], **made: Any) -> dict[str, Any]:
    """A record whose run resolved ``settings`` with ``made`` in place of some values (as
    if their defaults were those then), its ``settings.json`` written as a run writes it."""
    run = tmp_path / "run"
    run.mkdir(parents=True, exist_ok=True)
    resolved = dataclasses.replace(RunSettings.from_config(settings), **made)
    record = {**vars(resolved), "initial_weights_sha256": None}
    (run / "settings.json").write_text(json.dumps(to_record(record)))
    return {"run-dir": str(run), "settings": settings}


def test_a_record_made_under_another_default_is_found_by_the_key_that_changed(
    tmp_path: Path,
) -> None:
    rec = _record(tmp_path, SETTINGS, aggregation="fednova", local_epochs=3)
    assert drift(rec, SETTINGS) == {
        "aggregation": ("fednova", "fedavg"),
        "local-epochs": (3, RunSettings.from_config(SETTINGS).local_epochs),
    }
    assert drift(_record(tmp_path, SETTINGS), SETTINGS) == {}  # made as it runs now


def test_what_the_run_does_not_read_and_where_it_wrote_never_count(tmp_path: Path) -> None:
    # buffer-step is fedbuff's only; a synchronous run's value of it changes nothing
    rec = _record(tmp_path, SETTINGS, buffer_step="mean", output_dir="/elsewhere", seed=1)
    assert drift(rec, SETTINGS) == {}
    fedbuff = {**SETTINGS, "aggregation": "fedbuff"}
    assert drift(_record(tmp_path, fedbuff, buffer_step="mean"), fedbuff) == {
        "buffer-step": ("mean", "fleet")
    }
    # a record copied without its run folder cannot be checked
    assert drift({"settings": SETTINGS}, SETTINGS) == {}
    assert drift({"run-dir": str(tmp_path / "gone"), "settings": SETTINGS}, SETTINGS) == {}


def test_a_drifted_record_is_set_aside_and_its_cell_runs_again(tmp_path: Path) -> None:
    out = tmp_path / "out"
    settings = {**SETTINGS, "fleet": "default"}
    cell = Cell(tuple(sorted(settings.items())), "fleet text", (("arms", "off"),))
    path = record_path(out, cell)
    path.parent.mkdir(parents=True)
    good = {**_record(tmp_path / "a", settings), "key": cell.key()}
    path.write_text(json.dumps(good))
    todo, counts = pending([cell], out)
    assert todo == [] and counts["cells-reused"] == 1
    stale = {**_record(tmp_path / "b", settings, aggregation="fednova"), "key": cell.key()}
    path.write_text(json.dumps(stale))
    todo, counts = pending([cell], out)
    assert todo == [cell] and counts["cells-reused"] == 0
    assert not path.exists()
    (aside,) = path.parent.glob(f"{path.name}.stale-*")
    assert json.loads(aside.read_text())["key"] == cell.key()


ON_FLEET = {**SETTINGS, "fleet": "default"}
#: ``ON_FLEET`` with the aggregation its run resolves spelled out (as an arm that makes a
#: default explicit before it changes)
EXPLICIT = {**ON_FLEET, "aggregation": "fedavg"}


def _cell(settings: dict[str, Any], fleet_text: str = "fleet text") -> Cell:
    return Cell(tuple(sorted(settings.items())), fleet_text, (("arms", "off"),))


def _finished(tmp_path: Path, out: Path, cell: Cell, **made: Any) -> Path:
    """``cell``'s record as a study writes it (its run resolved ``cell``'s settings with
    ``made`` in place of some values) at its record path; the path."""
    record = {
        **_record(tmp_path, cell.settings, **made),
        "key": cell.key(),
        "cell-version": CELL_VERSION,
        "uses": [list(u) for u in cell.uses],
        "seed": cell.seed,
        "method": cell.method,
        "fleet-text": cell.fleet_text,
        "summary": {"final-accuracy": 0.9},
    }
    path = record_path(out, cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def test_a_cell_that_spells_out_what_its_run_resolved_adopts_the_record(tmp_path: Path) -> None:
    out = tmp_path / "out"
    old = _finished(tmp_path / "a", out, _cell(ON_FLEET))
    run_dir = json.loads(old.read_text())["run-dir"]
    cell = _cell(EXPLICIT)
    assert cell.key() != _cell(ON_FLEET).key()
    todo, counts = pending([cell], out)
    assert todo == [] and counts["cells-adopted"] == 1 and counts["cells-reused"] == 1
    adopted = json.loads(record_path(out, cell).read_text())
    assert adopted["key"] == cell.key() and adopted["settings"] == EXPLICIT
    assert adopted["adopted-from"] == old.name
    assert adopted["summary"] == {"final-accuracy": 0.9} and adopted["run-dir"] == run_dir
    # the old record is no cell's of this plan: set aside, so the report reads one run of
    # the (fleet, seed, arm)
    assert not old.exists() and len(list(old.parent.glob(f"{old.name}.stale-*"))) == 1
    todo, counts = pending([cell], out)  # found at its key from now on
    assert todo == [] and counts["cells-adopted"] == 0 and counts["cells-reused"] == 1


def test_an_adopted_record_that_is_still_a_planned_cells_own_stays(tmp_path: Path) -> None:
    """Two arms resolve to the same run (one spells the default out): both have it."""
    out = tmp_path / "out"
    implicit, explicit = _cell(ON_FLEET), _cell(EXPLICIT)
    old = _finished(tmp_path / "a", out, implicit)
    todo, counts = pending([implicit, explicit], out)
    assert todo == [] and counts["cells-adopted"] == 1 and old.is_file()
    assert record_path(out, explicit).is_file()


def test_a_record_whose_run_resolved_another_value_is_not_adopted(tmp_path: Path) -> None:
    out = tmp_path / "out"
    old = _finished(tmp_path / "a", out, _cell(ON_FLEET), aggregation="fednova")
    cell = _cell(EXPLICIT)
    todo, counts = pending([cell], out)
    assert todo == [cell] and counts["cells-adopted"] == 0
    assert not record_path(out, cell).exists()
    # the same record, its run resolved as the cell resolves now: adopted
    _record(tmp_path / "a", ON_FLEET)
    assert pending([cell], out)[0] == []
    assert json.loads(record_path(out, cell).read_text())["adopted-from"] == old.name


def test_a_record_set_aside_for_drift_is_adopted_by_the_cell_that_resolves_what_it_ran(
    tmp_path: Path,
) -> None:
    """A study spells out the old default in one arm while another arm keeps the cell's old
    overrides: the record leaves the implicit cell (drift) and goes to the explicit one."""
    out = tmp_path / "out"
    implicit, fednova = _cell(ON_FLEET), _cell({**ON_FLEET, "aggregation": "fednova"})
    old = _finished(tmp_path / "a", out, implicit, aggregation="fednova")
    todo, counts = pending([implicit, fednova], out)
    assert todo == [implicit] and counts["cells-adopted"] == 1
    (aside,) = old.parent.glob(f"{old.name}.stale-*")
    assert json.loads(record_path(out, fednova).read_text())["adopted-from"] == aside.name
    assert not record_path(out, implicit).exists()


@pytest.mark.parametrize(
    "other",
    [{"fleet-text": "another fleet"}, {"seed": 2}, {"cell-version": CELL_VERSION - 1}],
    ids=["fleet-text", "seed", "cell-version"],
)
def test_a_record_of_another_fleet_seed_or_cell_version_is_not_adopted(
    tmp_path: Path, other: dict[str, Any]
) -> None:
    out = tmp_path / "out"
    mate = _cell({**ON_FLEET, "seed": other.get("seed", 1)}, other.get("fleet-text", "fleet text"))
    path = _finished(tmp_path / "a", out, mate)
    path.write_text(json.dumps({**json.loads(path.read_text()), **other}))
    cell = _cell(EXPLICIT)
    todo, counts = pending([cell], out)
    assert todo == [cell] and counts["cells-adopted"] == 0
    # one that ran as the cell: adopted
    _finished(tmp_path / "b", out, _cell(ON_FLEET))
    todo, counts = pending([cell], out)
    assert todo == [] and counts["cells-adopted"] == 1


def test_a_record_without_its_runs_settings_is_not_adopted(tmp_path: Path) -> None:
    out = tmp_path / "out"
    old = _finished(tmp_path / "a", out, _cell(ON_FLEET))
    settings_json = tmp_path / "a" / "run" / "settings.json"
    text = settings_json.read_text()
    settings_json.unlink()
    cell = _cell(EXPLICIT)
    todo, counts = pending([cell], out)
    assert todo == [cell] and counts["cells-adopted"] == 0
    settings_json.write_text(text)
    todo, counts = pending([cell], out)
    assert todo == [] and json.loads(record_path(out, cell).read_text())["adopted-from"] == old.name


def _fedbuff_record(
    tmp_path: Path, reached: int | None, updates: list[tuple[str, int | None]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ``fedbuff`` record made before ``update-budget`` existed (its ``settings.json``
    without the key), that reached its target at version ``reached`` (None: it stopped on
    its budget), with ``updates`` (node, version applied or None) as its ``updates.jsonl``."""
    settings = {"method": "power-aware", "seed": 1, "num-rounds": 2, "aggregation": "fedbuff"}
    rec = _record(tmp_path, settings)
    made = Path(rec["run-dir"]) / "settings.json"
    then = json.loads(made.read_text())
    then = {k: v for k, v in then.items() if k not in ("update-budget", "update_budget")}
    made.write_text(json.dumps(then))
    lines = [
        {"node": n, "version": v, "choice": "b=16 f=921.6MHz"}
        for n, v in [("a", 1), ("b", 1), *updates]
    ]  # both nodes' profiled updates, left out of the count
    lines[:2] = [{**u, "choice": "profiling"} for u in lines[:2]]
    (made.parent / "updates.jsonl").write_text("\n".join(json.dumps(u) for u in lines))
    return {**rec, "summary": {"round-to-target": reached}}, settings


def test_a_fedbuff_record_from_before_update_budget_drifts_only_where_the_budget_decided(
    tmp_path: Path,
) -> None:
    """Node a sends most updates. Reached at version 3 with b's 1 update applied: each-node
    (2 of every node's) would have gone on too, so it is the same run; stopped on the
    fleet's budget, or reached only after every node had 2 applied: it drifts."""
    early: list[tuple[str, int | None]] = [("a", 2), ("a", 2), ("b", 3), ("a", 3), ("a", 4)]
    early.append(("b", 4))
    rec, settings = _fedbuff_record(tmp_path / "early", 3, early)
    assert drift(rec, settings) == {}
    rec, settings = _fedbuff_record(tmp_path / "budget", None, early)
    assert drift(rec, settings) == {"update-budget": ("fleet", "each-node")}
    rec, settings = _fedbuff_record(tmp_path / "late", 5, [*early, ("a", 5), ("b", None)])
    assert drift(rec, settings) == {"update-budget": ("fleet", "each-node")}
    # spelling the fleet's budget out: the record is its cell's run
    fleet = {**settings, "update-budget": "fleet"}
    assert drift(rec, fleet) == {}


def test_a_record_reused_under_a_renamed_arm_takes_the_plans_names(tmp_path: Path) -> None:
    """The same settings under another arm name (``off`` became ``synchronous``): the record
    is reused, not run again, and the report finds it under the new name."""
    out = tmp_path / "out"
    path = _finished(tmp_path / "a", out, _cell(ON_FLEET))
    renamed = Cell(_cell(ON_FLEET).overrides, "fleet text", (("arms", "synchronous"),))
    assert renamed.key() == _cell(ON_FLEET).key()
    todo, counts = pending([renamed], out)
    assert todo == [] and counts["cells-reused"] == 1 and counts["cells-adopted"] == 0
    assert json.loads(path.read_text())["uses"] == [["arms", "synchronous"]]
