"""Fleet-shared profiling on the node: measure a slice of the kind's LUT
(``profile_cells``, the ``train.profile`` message), take the kind's LUT the server sends
(``shared_lut``), and remember the cells this node measured itself, so checking one of them
costs nothing (``own_cell_check``). The protocol is in ``strategies.shared_profiling``.
No Flower import.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from fl_client import model_zoo, task
from fl_client.cell_measure import (
    CellOptions,
    MeasureContext,
    measure_cell_with_sigma,
    time_per_sample_s,
)
from fl_client.contract import CellsReport, ProfileRequest
from fl_client.drift import DriftCheck
from fl_client.lut import LUT, KindKey, LUTKey, lut_checksum, save_quietly
from fl_client.lut_format import LUTFormatError
from fl_client.node_context import RoundCost, node_context, workload_for

log = logging.getLogger(__name__)


#: What a node knows of its kind's LUT on its own board (``shared_lut``): checked and kept
#: ("verified"), never checked ("unchecked"), or refused by a trained round's check, so the
#: next round measures the chosen cell first and re-profiles its row ("refused").
VERIFIED, UNCHECKED, REFUSED = "verified", "unchecked", "refused"


def shared_lut(
    kind_lut: str, measure: MeasureContext, batch_sizes: list[int]
) -> tuple[LUT, str] | None:
    """The kind's LUT the server sent, as this node's copy, and what this board knows of it
    (``VERIFIED``: a later round, no measurement; ``UNCHECKED``; ``REFUSED``). None, with
    the reason logged, when it is not a valid LUT of this node's kind (the node then
    profiles its own)."""
    try:
        lut = LUT.from_json(kind_lut)
    except LUTFormatError as err:
        log.warning("kind-lut: not a valid LUT (%s); profiling this node's own", err)
        return None
    info = measure.device.info
    mine = KindKey(
        info.kind,
        info.backend,
        measure.workload.model_name,
        tuple(measure.workload.input_shape),
        tuple(batch_sizes),
        tuple(float(f) for f in measure.device.knob_values),
    )
    diff = mine.differences(KindKey.of_lut(lut))
    if diff:
        log.warning("kind-lut: for another kind (%s); profiling this node's own", "; ".join(diff))
        return None
    path = shared_copy_path(measure, lut.batch_sizes)
    marker = _marker(path).read_text().strip() if _marker(path).is_file() else ""
    source = lut_checksum(lut)
    if marker == f"{REFUSED} {source}":
        return lut, REFUSED
    if path.is_file() and marker == source:
        try:
            return LUT.load(path), VERIFIED
        except (LUTFormatError, OSError) as err:
            log.warning("shared LUT copy %s unreadable (%s): verifying again", path, err)
    return lut, UNCHECKED


def shared_copy_path(measure: MeasureContext, batch_sizes: tuple[int, ...]) -> Path:
    """Where this node keeps its checked copy of its kind's LUT."""
    return LUTKey.of(measure.device, measure.workload, batch_sizes, grid="shared").path(
        measure.cache_dir
    )


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".source")


def keep_verified(measure: MeasureContext, lut: LUT, kind_lut: str) -> None:
    """Keep ``lut`` (the kind's LUT as this board checked it, or its corrected copy) and
    mark it verified for the kind's LUT ``kind_lut``: later rounds measure nothing."""
    path = shared_copy_path(measure, lut.batch_sizes)
    save_quietly(lut, path)
    try:
        _marker(path).write_text(lut_checksum(LUT.from_json(kind_lut)))
    except OSError as err:
        log.warning("could not mark %s as verified (%s)", path, err)


def refuse(measure: MeasureContext, lut: LUT) -> None:
    """A trained round found this board off its kind's LUT: the next round measures its
    chosen cell before training, and re-profiles its row if it is still off."""
    path = shared_copy_path(measure, lut.batch_sizes)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _marker(path).write_text(f"{REFUSED} {lut_checksum(lut)}")
    except OSError as err:
        log.warning("could not mark %s as refused (%s)", path, err)


def own_cells_path(measure: MeasureContext, batch_sizes: tuple[int, ...]) -> Path:
    path = shared_copy_path(measure, batch_sizes)
    return path.with_name(path.name + ".own-cells.json")


def own_cell_check(
    measure: MeasureContext, lut: LUT, point: tuple[int, float], threshold: float
) -> DriftCheck | None:
    """A chosen cell this node measured itself in the shared exchanges is already checked on
    this board: compare that measurement with the kind's LUT, measuring nothing. None when
    the node did not measure it (or its record is unreadable)."""
    path = own_cells_path(measure, lut.batch_sizes)
    try:
        own = json.loads(path.read_text())[f"{point[0]}@{point[1]!r}"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    i, j = lut.batch_sizes.index(point[0]), lut.knob_values.index(point[1])
    predicted = (lut.time_per_sample_s[i, j], lut.peak_power_w[i, j], lut.avg_power_w[i, j])
    deviation = max(abs(float(x) / float(p) - 1.0) for x, p in zip(own, predicted, strict=True))
    if deviation > threshold:
        return None  # measure again, and re-profile the row if it is still off
    return DriftCheck(deviation, False, lut, 0.0, 0.0)


def keep_own_cells(
    measure: MeasureContext, batch_sizes: tuple[int, ...], cells: dict[str, list[float]]
) -> None:
    """Remember the cells this node measured for its kind (for ``_own_cell_check``)."""
    path = own_cells_path(measure, batch_sizes)
    try:
        known = json.loads(path.read_text()) if path.is_file() else {}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**known, **cells}))
    except (OSError, ValueError) as err:
        log.warning("could not keep the measured cells in %s (%s)", path, err)


def profile_cells(
    run_config: Mapping[str, Any],
    node_config: Mapping[str, Any],
    config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], CellsReport]:
    """Measure this node's slice of its kind's LUT (fleet-shared profiling).

    Each requested (b, f) is measured as the profiler measures a cell (warm-up, then the
    measured steps, GPU locked at f and restored). With ``steps-train`` the steps are real
    minibatches of this node's data whose updates are kept (the returned weights); else
    synthetic batches on a throw-away model (the weights come back unchanged).
    """
    ctx = node_context(run_config, node_config)
    req = ProfileRequest.from_config(config)
    s = ctx.settings
    torch.set_num_threads(1)
    model = model_zoo.build_model(req.model).to(task.compute_device())  # as profiling's steps
    model.load_state_dict(dict(state))
    workload = workload_for(req.model)
    steps = None
    if req.steps_train:
        data = ctx.local_data()
        steps = task.DataSteps(
            model, data[0], req.lr_ref, req.b_ref, seed=s.seed + req.server_round
        )
    factories: dict[int, Callable[[], object]] = {}
    rows: list[tuple[float, float, float, float]] = []
    cost = RoundCost()
    device = ctx.open_device(req.server_round)
    try:
        for b, f in req.cells:
            if b not in factories:
                factories[b] = (
                    steps.factory(b)
                    if steps is not None
                    else task.make_train_step(req.model, workload.input_shape, b)
                )
            m, time_s, energy_j, sigma_w = measure_cell_with_sigma(
                device, workload, b, factories[b], f, CellOptions(req.warmup_steps, req.steps)
            )
            cost.add(time_s, energy_j)
            rows.append(
                (time_per_sample_s(m, b, req.steps), m.peak_power_w, m.avg_power_w, sigma_w)
            )
        own = {f"{b}@{float(f)!r}": list(r[:3]) for (b, f), r in zip(req.cells, rows, strict=True)}
        keep_own_cells(
            MeasureContext(
                device,
                workload,
                functools.partial(task.make_train_step, req.model, workload.input_shape),
                ctx.cache_dir / "lut",
            ),
            req.batch_sizes,
            own,
        )
    finally:
        device.close()
    report = CellsReport(
        cells_b=tuple(float(b) for b in req.cells_b),
        cells_knob_value=tuple(req.cells_knob_value),
        time_per_sample_s=tuple(r[0] for r in rows),
        peak_power_w=tuple(r[1] for r in rows),
        avg_power_w=tuple(r[2] for r in rows),
        profile_time_s=cost.time_s,
        profile_energy_j=cost.energy_j,
        num_examples=float(steps.samples if steps is not None else 0),
        peak_sigma_w=tuple(r[3] for r in rows),
    )
    return task.cpu_state(model), report
