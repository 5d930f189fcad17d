"""Fleet-shared profiling's plan: kinds, seed and confirm slices, the merge into one LUT per
kind (``strategies.shared_profiling``; the exchanges over Flower: ``test_shared_exchange``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest

from fl_client.contract import Cap, CellsReport, NodeDescriptor, TrainConfig
from fl_client.devices.descriptors import DeviceSpec, load_device_spec
from fl_client.devices.simulated import avg_power_w, power_w
from fl_client.devices.simulated import time_per_sample_s as twin_time_per_sample_s
from fl_client.lut import LUT, KindKey, lut_checksum
from fl_client.lut_plan import BF
from fl_client.node import workload_for
from fl_client.power import PowerLimit
from fl_client.selection import Tables
from fl_client.selector import Objective, choose_cell
from strategies.shared_profiling import (
    KindProfile,
    SharedOptions,
    cell_cost,
    cheap_seeds,
    confirm_requests,
    kinds_of,
    seed_requests,
    waiting_cell,
)

pytestmark = pytest.mark.usefixtures("flower_task_identity")

NANO, ORIN = load_device_spec("jetson-nano"), load_device_spec("jetson-agx-orin")
FLOPS = workload_for("cnn").flops_per_sample
SHAPE = (3, 32, 32)
B = (8, 16, 32, 64)
R = (1.0, 1.0, 1.0, 0.5)
PROFILE = "train.profile"
TEMPLATE = TrainConfig(
    server_round=0,
    method="power-aware",
    model="cnn",
    batch_sizes=B,
    r=R,
    lr_ref=0.005,
    b_ref=128,
    local_epochs=1,
)


def _node(
    name: str, spec: DeviceSpec, cap: Cap, max_b: int = 64, schedule: str = ""
) -> NodeDescriptor:
    return NodeDescriptor(
        node_name=name,
        partition_id=0,
        device=spec.kind,
        backend="simulated",
        p_max=cap,
        p_max_schedule=schedule,
        knob_values=tuple(spec.gpu_freqs_mhz),
        memory_bytes=4 << 30,
        power_rail=spec.power_rail,
        max_batch_size=max_b,
        cap_margin=0.05,
    )


#: Three Nanos of one kind under two caps, and an Orin of its own kind.
FLEET = {
    11: _node("nano-a", NANO, Cap(5.0)),
    12: _node("nano-b", NANO, Cap(5.0)),
    13: _node("nano-c", NANO, Cap(7.0)),
    21: _node("orin", ORIN, Cap.NONE),
}
NANO_KIND = KindKey("jetson-nano", "simulated", "cnn", SHAPE, B, tuple(NANO.gpu_freqs_mhz))
ORIN_KIND = KindKey("jetson-agx-orin", "simulated", "cnn", SHAPE, B, tuple(ORIN.gpu_freqs_mhz))


def _twin(spec: DeviceSpec, cell: BF, spread: float = 1.0) -> tuple[float, float, float]:
    """The twin's noiseless time per sample, peak and average power of ``cell``."""
    b, f = cell
    return (
        twin_time_per_sample_s(spec, b, f, FLOPS) * spread,
        power_w(spec, b, f, FLOPS) * spread,
        avg_power_w(spec, b, f, FLOPS) * spread,
    )


def _cells_report(
    spec: DeviceSpec, cells: Iterable[BF], spread: float = 1.0, **over: Any
) -> CellsReport:
    cells = list(cells)
    values = [_twin(spec, c, spread) for c in cells]
    fields: dict[str, Any] = {
        "cells_b": tuple(float(b) for b, _ in cells),
        "cells_knob_value": tuple(f for _, f in cells),
        "time_per_sample_s": tuple(v[0] for v in values),
        "peak_power_w": tuple(v[1] for v in values),
        "avg_power_w": tuple(v[2] for v in values),
        "profile_time_s": 0.1 * len(cells),
        "profile_energy_j": 0.3 * len(cells),
        "num_examples": 0.0,
    }
    return CellsReport(**{**fields, **over})


def _batch_sizes(fleet: dict[int, NodeDescriptor]) -> dict[int, list[int]]:
    return {n: [b for b in B if b <= d.max_batch_size] for n, d in fleet.items()}


def _all(requests: dict[int, list[BF]]) -> list[BF]:
    return [c for cells in requests.values() for c in cells]


# --------------------------------------------------------------------------- kinds


def test_nodes_of_one_device_and_b_are_one_kind_and_a_smaller_memory_is_another() -> None:
    fleet = {
        **FLEET,
        12: _node("nano-b", NANO, Cap(7.0), schedule="1:7,3:4.5"),
        14: _node("nano-small", NANO, Cap(5.0), max_b=32),
    }
    kinds = kinds_of(fleet, _batch_sizes(fleet), "cnn", SHAPE)
    small = dataclasses.replace(NANO_KIND, batch_sizes=(8, 16, 32))
    assert set(kinds) == {NANO_KIND, small, ORIN_KIND}
    assert kinds[NANO_KIND].nodes == [11, 12, 13]  # ordered by node name
    assert kinds[small].nodes == [14] and kinds[ORIN_KIND].nodes == [21]
    # every cap a node runs under, with its margin: a schedule's steps, else its cap
    assert kinds[NANO_KIND].caps == {
        11: [(Cap(5.0), 0.05)],
        12: [(Cap(7.0), 0.05), (Cap(4.5), 0.05)],
        13: [(Cap(7.0), 0.05)],
    }
    assert kinds[ORIN_KIND].caps == {21: [(Cap.NONE, 0.05)]}
    assert NANO_KIND.differences(small) == ["batch-sizes is (8, 16, 32), expected (8, 16, 32, 64)"]


# --------------------------------------------------------------------------- seeds


@pytest.mark.parametrize("n_nodes", [1, 3, 10])
def test_seed_slices_are_disjoint_cover_the_seeds_and_balance_device_time(n_nodes: int) -> None:
    fleet = {100 + k: _node(f"nano-{k:02d}", NANO, Cap(5.0)) for k in range(n_nodes)}
    fleet[21] = FLEET[21]
    kinds = kinds_of(fleet, _batch_sizes(fleet), "cnn", SHAPE)
    requests = seed_requests(kinds, SharedOptions(seed_cells=8))
    for kind, prof in kinds.items():
        seeds = cheap_seeds(kind.batch_sizes, kind.knob_values, 8)
        assert len(seeds) == 8
        slices = {n: requests[n] for n in prof.nodes if n in requests}
        cells = _all(slices)
        assert len(cells) == len(set(cells))  # disjoint: no cell measured twice
        assert set(cells) == set(seeds)  # together: the whole seed set
        assert len(slices) == min(len(prof.nodes), len(seeds))  # nobody idles while others work
        loads = [sum(cell_cost(c) for c in s) for s in slices.values()]
        assert max(loads) <= sum(loads) / len(loads) + max(cell_cost(c) for c in seeds)
    # nothing but the fleet's nodes is asked, each for cells of its own kind
    assert set(requests) <= set(fleet)
    orin = set(requests[21])
    assert orin == set(cheap_seeds(B, ORIN.gpu_freqs_mhz, 8))


def test_the_costliest_corner_is_not_seeded() -> None:
    """The largest b at the lowest f costs most and is never a choice."""
    seeds = cheap_seeds(B, NANO.gpu_freqs_mhz, 8)
    assert (64, NANO.gpu_freqs_mhz[0]) not in seeds
    assert {b for b, _ in seeds} == set(B)  # every row still seeded


def test_slices_follow_the_nodes_names_not_the_ids_flower_gives_them() -> None:
    """Flower gives simulated nodes new random ids every run: the same fleet must measure
    the same slices on the same nodes (and so the same twin noise) in every run."""
    names = {n: FLEET[n].node_name for n in FLEET}
    renumbered = {999 - n: d for n, d in FLEET.items()}  # the id order reversed
    by_name = []
    for fleet in (FLEET, renumbered):
        kinds = kinds_of(fleet, _batch_sizes(fleet), "cnn", SHAPE)
        requests = seed_requests(kinds, SharedOptions())
        by_name.append({fleet[n].node_name: cells for n, cells in requests.items()})
    assert by_name[0] == by_name[1] and set(by_name[0]) <= set(names.values())


def test_seeds_stay_at_or_above_the_kinds_profile_floor() -> None:
    """Below the floor (the lowest cap's B1 frequency) no cap of the kind has its choice,
    and every step there runs at the slowest clocks: the seeds spread over the rest."""
    freqs = NANO.gpu_freqs_mhz
    floor = freqs[3]
    seeds = cheap_seeds(B, freqs, 8, floor)
    assert len(seeds) == 8 and min(f for _, f in seeds) == floor
    assert {b for b, _ in seeds} == set(B)  # every row still seeded
    assert max(f for _, f in seeds) == freqs[-1]
    # cheaper than the seeds over the whole grid, by the cost model that deals them
    assert sum(map(cell_cost, seeds)) < sum(map(cell_cost, cheap_seeds(B, freqs, 8)))
    # a floor at the top still leaves two frequencies to fit
    assert {f for _, f in cheap_seeds(B, freqs, 8, freqs[-1])} == set(freqs[-2:])


def test_a_kinds_floor_is_the_lowest_of_its_nodes() -> None:
    fleet = {
        11: dataclasses.replace(FLEET[11], profile_floor_mhz=307.2),
        12: dataclasses.replace(FLEET[12], profile_floor_mhz=614.4),
        21: dataclasses.replace(FLEET[21], profile_floor_mhz=0.0),
    }
    kinds = kinds_of(fleet, _batch_sizes(fleet), "cnn", SHAPE)
    assert kinds[NANO_KIND].floor_mhz == 307.2
    assert kinds[ORIN_KIND].floor_mhz == 0.0  # no floor known: the whole grid
    one = {11: fleet[12]}
    assert kinds_of(one, _batch_sizes(one), "cnn", SHAPE)[NANO_KIND].floor_mhz == 614.4


# --------------------------------------------------------------------------- confirm


def _measure(kinds: dict[KindKey, KindProfile], requests: dict[int, list[BF]]) -> None:
    """Every requested cell measured on the twin of its node's kind."""
    for prof in kinds.values():
        spec = NANO if prof.kind.device_kind == NANO.kind else ORIN
        for node in prof.nodes:
            if requests.get(node):
                prof.add(_cells_report(spec, requests[node]))


@pytest.mark.parametrize("cells_per_cap", [1, 2])
def test_confirm_cells_stay_within_the_budget_per_distinct_cap_and_go_to_its_nodes(
    cells_per_cap: int,
) -> None:
    fleet = {**FLEET, 14: _node("nano-d", NANO, Cap.NONE)}
    kinds = kinds_of(fleet, _batch_sizes(fleet), "cnn", SHAPE)
    opts = SharedOptions(cells_per_cap=cells_per_cap)
    _measure(kinds, seed_requests(kinds, opts))
    r_of = {k: list(R) for k in kinds}
    limit_of = {n: d.p_max.with_margin(d.cap_margin).limit_w for n, d in fleet.items()}
    spent: dict[tuple[KindKey, float], int] = {}
    for _ in range(4):  # more exchanges than the budget allows
        before = {k: set(p.measured) for k, p in kinds.items()}
        requests = confirm_requests(kinds, r_of, opts)
        assert len(_all(requests)) == len(set(_all(requests)))  # one node per cell
        for node, cells in requests.items():
            kind = next(k for k, p in kinds.items() if node in p.nodes)
            assert cells and not set(cells) & before[kind]  # never a measured cell again
            key = (kind, limit_of[node])
            spent[key] = spent.get(key, 0) + len(cells)
        _measure(kinds, requests)
    # nano: 4.75 W (two nodes), 6.65 W, no cap; orin: no cap
    assert {lim for _, lim in spent} <= {4.75, 6.65, math.inf}
    assert all(n <= cells_per_cap for n in spent.values()), spent
    assert sum(spent.values()) >= 1  # eight seeds over 48 cells leave some cap unsure


def test_a_kind_with_fewer_than_two_cells_is_not_confirmed_and_others_still_are() -> None:
    kinds = kinds_of(FLEET, _batch_sizes(FLEET), "cnn", SHAPE)
    seeds = seed_requests(kinds, SharedOptions())
    _measure(kinds, {n: c for n, c in seeds.items() if n != 21})
    kinds[ORIN_KIND].add(_cells_report(ORIN, seeds[21][:1]))
    requests = confirm_requests(kinds, {k: list(R) for k in kinds}, SharedOptions())
    assert 21 not in requests
    assert set(requests) <= {11, 12, 13} and requests


# --------------------------------------------------------------------------- merge


def test_overlapping_cells_merge_to_the_median_and_failed_cells_are_dropped() -> None:
    f = NANO.gpu_freqs_mhz
    prof = KindProfile(NANO_KIND, [11, 12, 13], {})
    cell, top = (8, f[0]), (64, f[-1])
    for k, t in enumerate((1e-3, 2e-3, 10e-3)):
        prof.add(_cells_report(NANO, [cell], time_per_sample_s=(t,), peak_power_w=(3.0 + k,)))
    prof.add(_cells_report(NANO, [top], time_per_sample_s=(1e-4,)))
    prof.add(_cells_report(NANO, [top], time_per_sample_s=(3e-4,)))
    bad_cells = [(16, f[1]), (16, f[2]), (16, f[3]), (16, f[4])]
    prof.add(
        _cells_report(
            NANO,
            bad_cells,
            time_per_sample_s=(math.nan, 1e-3, 1e-3, -1e-3),
            peak_power_w=(3.0, math.inf, 3.0, 3.0),
            avg_power_w=(2.0, 2.0, 0.0, 2.0),
        )
    )
    assert set(prof.measured) == {cell, top}
    time_s, peak_w, _, _ = prof.tables()
    assert time_s[0, 0] == pytest.approx(2e-3) and peak_w[0, 0] == pytest.approx(4.0)
    assert time_s[3, -1] == pytest.approx(2e-4)  # two nodes: the middle of both
    lut = prof.lut(profile_time_s=1.5, profile_energy_j=4.0)
    assert lut is not None
    assert lut.grid == "shared" and lut.limit.cap_w is None and KindKey.of_lut(lut) == NANO_KIND
    assert lut.cells_profiled == 2 and np.isnan(lut.time_per_sample_s[1]).all()
    assert (lut.profile_time_s, lut.profile_energy_j) == (1.5, 4.0)
    assert lut_checksum(LUT.from_json(lut.to_json())) == lut_checksum(lut)


def test_a_confirm_cell_measured_over_the_cap_has_the_cell_below_it_confirmed() -> None:
    """The cell last asked for a cap (where the fit put its choice) was measured just over
    the cap (peak + k·σ): the next confirm exchange measures that row's next lower
    frequency, the cap's boundary there, rather than let the fit guess again."""
    f = NANO.gpu_freqs_mhz
    whole = KindProfile(NANO_KIND, [11], {})
    whole.add(_cells_report(NANO, [(b, ff) for b in B for ff in f]))
    t, p, a, _ = whole.tables()
    cap = Cap(5.0)
    limit = cap.with_margin(0.05)
    rule = Objective(peak_sigma_k=0.0, tie_tolerance=0.02)
    pick = choose_cell(
        Tables(t, p, a), list(R), limit, objective=rule
    )  # the noiseless twin's choice
    assert pick is not None and pick[1] > 0
    over = (B[pick[0]], f[pick[1]])
    prof = KindProfile(NANO_KIND, [11, 12], {11: [(cap, 0.05)], 12: [(cap, 0.05)]})
    prof.add(_cells_report(NANO, [c for c in cheap_seeds(B, f, 8) if c != over]))
    prof.add(_cells_report(NANO, [over], peak_sigma_w=(1.0,)))  # over the cap with 2σ
    prof.last[limit], prof.spent[limit] = pick, 1
    requests = confirm_requests({NANO_KIND: prof}, {NANO_KIND: list(R)}, SharedOptions())
    assert [c for cells in requests.values() for c in cells] == [(over[0], f[pick[1] - 1])]
    assert prof.last[limit] == (pick[0], pick[1] - 1) and prof.spent[limit] == 2


def test_the_kinds_caps_share_one_pool_of_confirm_cells() -> None:
    """A pool of ``cells_per_cap`` × distinct caps: a cap may take more than its share
    while the pool lasts, and no cap gets a cell once it is spent."""
    f = NANO.gpu_freqs_mhz
    caps = {11: [(Cap(4.5), 0.05)], 12: [(Cap.NONE, 0.05)]}
    prof = KindProfile(NANO_KIND, [11, 12], caps)
    prof.add(_cells_report(NANO, cheap_seeds(B, f, 8)))
    opts = SharedOptions(cells_per_cap=2)
    low = Cap(4.5).with_margin(0.05)
    prof.spent = {low: 3}  # the 4.5 W cap took 3 of the 4 (the other cap was settled)
    requests = confirm_requests({NANO_KIND: prof}, {NANO_KIND: list(R)}, opts)
    assert sum(len(c) for c in requests.values()) == 1  # the last cell of the pool
    assert sum(prof.spent.values()) == 4
    assert confirm_requests({NANO_KIND: prof}, {NANO_KIND: list(R)}, opts) == {}


def test_sigma_of_the_per_step_peaks_reaches_the_kinds_lut_and_its_confirm_rule() -> None:
    f = NANO.gpu_freqs_mhz
    cell = (8, f[0])
    prof = KindProfile(NANO_KIND, [11, 12], {})
    prof.add(_cells_report(NANO, [cell], peak_power_w=(4.0,), peak_sigma_w=(0.2,)))
    prof.add(_cells_report(NANO, [cell], peak_power_w=(4.4,), peak_sigma_w=(0.1,)))
    prof.add(_cells_report(NANO, [cell], peak_power_w=(3.9,)))  # an older node: no σ
    _, peak_w, _, sigma_w = prof.tables()
    assert peak_w[0, 0] == pytest.approx(4.0)
    assert sigma_w[0, 0] == pytest.approx(0.2)  # the σ measured with the median peak
    lut = prof.lut(1.0, 1.0)
    assert lut is not None and lut.peak_sigma_w[0, 0] == pytest.approx(0.2)
    assert np.isnan(LUT.from_json(lut.to_json()).peak_sigma_w[1, 0])
    # a reply without σ (an older node) parses, with σ unknown
    old = _cells_report(NANO, [cell]).to_metrics()
    old.pop("peak-sigma-w")
    assert CellsReport.from_metrics(old).peak_sigma_w == ()
    # a reply from a node that named the knob's values cells-freq-mhz reads the same
    older = {("cells-freq-mhz" if k == "cells-knob-value" else k): v for k, v in old.items()}
    assert "cells-knob-value" not in older
    assert CellsReport.from_metrics(older) == CellsReport.from_metrics(old)
    with pytest.raises(ValueError, match="peak-sigma-w: has 2 values, cells-b has 1"):
        _cells_report(NANO, [cell], peak_sigma_w=(0.1, 0.2))


def test_a_kind_whose_every_cell_failed_has_no_lut() -> None:
    prof = KindProfile(NANO_KIND, [11], {})
    assert prof.lut(0.0, 0.0) is None
    prof.add(_cells_report(NANO, [(8, NANO.gpu_freqs_mhz[0])], time_per_sample_s=(math.nan,)))
    assert prof.measured == {} and prof.lut(1.0, 1.0) is None


# --------------------------------------------------------------------------- waiting


def test_a_waiting_node_trains_at_the_fastest_cell_of_its_slice_that_its_cap_allows() -> None:
    f = NANO.gpu_freqs_mhz
    cells = [(8, f[-1]), (64, f[-1]), (64, f[2]), (16, f[4])]
    report = _cells_report(NANO, cells)
    tps = dict(zip(cells, report.time_per_sample_s, strict=True))
    peak = dict(zip(cells, report.peak_power_w, strict=True))
    # uncapped: the least time per sample of the slice, and the steps that fit in the gap
    fastest = min(cells, key=lambda c: tps[c])
    gap_s = 0.25
    assert waiting_cell(report.measurements(), [PowerLimit()], gap_s, 2.0) == (
        fastest,
        math.floor(gap_s / (tps[fastest] * fastest[0])),
    )
    # a cap just below the fastest cell's peak rules it out: the next fastest under it
    limit = PowerLimit(peak[fastest] - 1e-6)
    allowed = [c for c in cells if peak[c] < limit.limit_w]
    assert allowed and fastest not in allowed
    cell, _ = waiting_cell(report.measurements(), [limit], gap_s, 0.0) or ((0, 0.0), 0)
    assert cell == min(allowed, key=lambda c: tps[c])
    # every cap the node runs under counts; so does k·σ of the peaks (the selection rule)
    assert waiting_cell(report.measurements(), [PowerLimit(), limit], gap_s, 0.0) == waiting_cell(
        report.measurements(), [limit], gap_s, 0.0
    )
    noisy = dataclasses.replace(report, peak_sigma_w=(1.0,) * len(cells))
    margin = PowerLimit(peak[cell] + 1.0)  # the chosen cell's peak + 2σ is over it
    plain = waiting_cell(report.measurements(), [margin], gap_s, 2.0)
    assert plain is not None and plain[0] == cell
    again = waiting_cell(noisy.measurements(), [margin], gap_s, 2.0)
    assert again is None or again[0] != cell


def test_no_waiting_cell_when_nothing_is_feasible_or_no_step_fits() -> None:
    f = NANO.gpu_freqs_mhz
    report = _cells_report(NANO, [(8, f[-1]), (64, f[-1])])
    assert (
        waiting_cell(report.measurements(), [PowerLimit(0.5)], 1.0, 2.0) is None
    )  # under every peak
    step_s = min(t * b for t, b in zip(report.time_per_sample_s, (8, 64), strict=True))
    assert (
        waiting_cell(report.measurements(), [PowerLimit()], step_s / 2, 2.0) is None
    )  # not one step
    assert waiting_cell(report.measurements(), [PowerLimit()], 0.0, 2.0) is None
    failed = dataclasses.replace(report, time_per_sample_s=(math.nan, -1.0))
    assert waiting_cell(failed.measurements(), [PowerLimit()], 1.0, 2.0) is None
