"""A finished cell's record against the settings its cell runs with now
(``simulations.experiments.settings_drift``, ``federated.pending``): a record made before a
default changed is found by its run's ``settings.json`` and set aside; what the run does not
read, and where it wrote its files, never counts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from fl_client.contract import to_record
from fl_client.settings import RunSettings
from simulations.experiments.federated import Cell, pending, record_path
from simulations.experiments.settings_drift import drift

SETTINGS = {"method": "power-aware", "seed": 1, "num-rounds": 2}


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
