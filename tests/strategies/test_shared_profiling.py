"""Fleet-shared profiling: kinds, seed and confirm slices, the merge into one LUT per kind
(``strategies.shared_profiling``), and the strategy's shared phase over a fake Grid (slices
that fail, a library hit, a node that joins later, FedAvg of the profiled steps)."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)

from fl_client.contract import Cap, CellsReport, NodeDescriptor, ProfileRequest, TrainConfig
from fl_client.devices.simulated import DeviceSpec, avg_power_w, load_device_spec, power_w
from fl_client.devices.simulated import time_per_sample_s as twin_time_per_sample_s
from fl_client.lut import LUT, KindKey, lut_checksum
from fl_client.node import workload_for
from fl_client.selector import Objective, choose_cell
from fl_server.lut_library import LUTLibrary
from strategies import shared_profiling
from strategies.power_aware import PowerAwareFedAvg
from strategies.shared_profiling import (
    Cell,
    KindProfile,
    SharedOptions,
    SharedProfiling,
    cell_cost,
    cheap_seeds,
    confirm_requests,
    kinds_of,
    seed_requests,
)
from tests.strategies.test_power_aware import FakeGrid, report

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
        gpu_freqs_mhz=tuple(spec.gpu_freqs_mhz),
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


def _twin(spec: DeviceSpec, cell: Cell, spread: float = 1.0) -> tuple[float, float, float]:
    """The twin's noiseless time per sample, peak and average power of ``cell``."""
    b, f = cell
    return (
        twin_time_per_sample_s(spec, b, f, FLOPS) * spread,
        power_w(spec, b, f, FLOPS) * spread,
        avg_power_w(spec, b, f, FLOPS) * spread,
    )


def _cells_report(
    spec: DeviceSpec, cells: Iterable[Cell], spread: float = 1.0, **over: Any
) -> CellsReport:
    cells = list(cells)
    values = [_twin(spec, c, spread) for c in cells]
    fields: dict[str, Any] = {
        "cells_b": tuple(float(b) for b, _ in cells),
        "cells_freq_mhz": tuple(f for _, f in cells),
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


def _all(requests: dict[int, list[Cell]]) -> list[Cell]:
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
        seeds = cheap_seeds(kind.batch_sizes, kind.freqs_mhz, 8)
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


def _measure(kinds: dict[KindKey, KindProfile], requests: dict[int, list[Cell]]) -> None:
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
    assert lut.grid == "shared" and lut.p_max_w is None and KindKey.of_lut(lut) == NANO_KIND
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
    pick = choose_cell(t, p, a, list(R), limit, objective=rule)  # the noiseless twin's choice
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
    with pytest.raises(ValueError, match="peak-sigma-w: has 2 values, cells-b has 1"):
        _cells_report(NANO, [cell], peak_sigma_w=(0.1, 0.2))


def test_a_kind_whose_every_cell_failed_has_no_lut() -> None:
    prof = KindProfile(NANO_KIND, [11], {})
    assert prof.lut(0.0, 0.0) is None
    prof.add(_cells_report(NANO, [(8, NANO.gpu_freqs_mhz[0])], time_per_sample_s=(math.nan,)))
    assert prof.measured == {} and prof.lut(1.0, 1.0) is None


# --------------------------------------------------------------------------- the strategy


class BatchGrid(FakeGrid):
    """A FakeGrid that keeps each ``send_and_receive`` call's messages apart (one exchange)."""

    def __init__(self, node_ids: list[int], handler: Callable[[Message], Message | None]):
        super().__init__(node_ids, handler)
        self.batches: list[list[Message]] = []

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        batch = list(messages)
        self.batches.append(batch)
        return super().send_and_receive(batch, timeout=timeout)

    def profile_batches(self) -> list[list[Message]]:
        return [b for b in self.batches if b and b[0].metadata.message_type == PROFILE]


def _cells_of(msg: Message) -> list[Cell]:
    return ProfileRequest.from_config(dict(msg.content.config_records["config"])).cells


def _handler(
    fail: Iterable[int] = (), silent: Iterable[int] = (), fleet: dict[int, NodeDescriptor] = FLEET
) -> Callable[[Message], Message | None]:
    """Nodes that measure their slice on the twin (≈ 1% apart from node to node), with
    ``profile-time-s`` 0.1 s per cell, and train (arrays: the ones received + node id, with
    10 · node id examples); ``fail`` / ``silent`` nodes fail or never answer a slice."""

    def handle(msg: Message) -> Message | None:
        node = msg.metadata.dst_node_id
        kind = msg.metadata.message_type
        if kind == MessageType.QUERY:
            device = ConfigRecord(fleet[node].to_config())
            return Message(RecordDict({"device": device}), reply_to=msg)
        if kind == PROFILE and node in silent:
            return None
        if kind == PROFILE and node in fail:
            return Message(Error(code=1, reason=f"node {node} lost its GPU"), reply_to=msg)
        received = msg.content.array_records["arrays"].to_numpy_ndarrays()[0]
        arrays = ArrayRecord([received + node])
        if kind == PROFILE:
            req = ProfileRequest.from_config(dict(msg.content.config_records["config"]))
            spec = NANO if fleet[node].device == NANO.kind else ORIN
            examples = 10.0 * node if req.steps_train else 0.0
            cells = _cells_report(spec, req.cells, 1.0 + 0.01 * (node % 3), num_examples=examples)
            metrics = MetricRecord(dict[str, Any](cells.to_metrics()))
        else:
            metrics = MetricRecord(dict(report(node, num_examples=10.0 * node).to_metrics()))
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return handle


def _strategy(
    library: Path, fleet: dict[int, NodeDescriptor] = FLEET, **shared: Any
) -> PowerAwareFedAvg:
    strategy = PowerAwareFedAvg(
        template=TEMPLATE,
        query_config={"model": "cnn", "batch-sizes": list(B)},
        min_train_nodes=1,
        min_available_nodes=1,
    )
    strategy.fleet = dict(fleet)
    strategy.shared = SharedProfiling(library=LUTLibrary(library), input_shape=SHAPE, **shared)
    return strategy


def _zeros() -> ArrayRecord:
    return ArrayRecord([np.zeros(3)])


def _kind_lut(strategy: PowerAwareFedAvg, node_id: int, server_round: int = 1) -> LUT | None:
    """The kind LUT in ``node_id``'s TRAIN config, as the node parses it."""
    cfg = TrainConfig.from_config(strategy.node_config(server_round, node_id).to_config())
    return None if cfg.kind_lut is None else LUT.from_json(cfg.kind_lut)


def _requested(grid: BatchGrid, nodes: Iterable[int]) -> set[Cell]:
    nodes = set(nodes)
    return {
        c
        for batch in grid.profile_batches()
        for m in batch
        if m.metadata.dst_node_id in nodes
        for c in _cells_of(m)
    }


def _lut_cells(lut: LUT) -> set[Cell]:
    ii, jj = np.nonzero(~np.isnan(lut.time_per_sample_s))
    return {(lut.batch_sizes[i], lut.freqs_mhz[j]) for i, j in zip(ii, jj, strict=True)}


def test_each_kind_gets_one_lut_of_what_its_nodes_measured_in_its_train_config(
    tmp_path: Path,
) -> None:
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(tmp_path / "library")
    strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    batches = grid.profile_batches()
    assert grid.sent and len(grid.sent) == sum(len(b) for b in batches)  # only profiling
    assert {m.metadata.dst_node_id for m in batches[0]} == set(FLEET)  # the seeds: everyone
    assert 2 <= len(batches) <= 1 + strategy.shared.options.confirm_exchanges  # type: ignore[union-attr]
    assert set(strategy.kind_luts) == {NANO_KIND, ORIN_KIND}
    for kind, nodes, spec in ((NANO_KIND, [11, 12, 13], NANO), (ORIN_KIND, [21], ORIN)):
        lut = strategy.kind_luts[kind]
        assert lut.grid == "shared" and KindKey.of_lut(lut) == kind
        # measured cells only: exactly what its nodes were asked for, each as measured
        assert _lut_cells(lut) == _requested(grid, nodes)
        for b, f in _lut_cells(lut):
            i, j = lut.batch_sizes.index(b), lut.freqs_mhz.index(f)
            assert lut.time_per_sample_s[i, j] == pytest.approx(_twin(spec, (b, f))[0], rel=0.03)
        # every node of the kind gets the same table, and the library keeps it
        for node in nodes:
            sent = _kind_lut(strategy, node)
            assert sent is not None and lut_checksum(sent) == lut_checksum(lut)
        kept = LUTLibrary(tmp_path / "library").get(kind)
        assert kept is not None and lut_checksum(kept) == lut_checksum(lut)
    assert [e["source"] for e in strategy.shared_log] == ["fleet-shared", "fleet-shared"]
    # the nano kind needed fewer cells than its 48
    assert strategy.kind_luts[NANO_KIND].cells_profiled < len(B) * len(NANO.gpu_freqs_mhz) / 3


@pytest.mark.parametrize("how", ["fails", "never answers"])
def test_a_node_whose_slice_fails_leaves_its_kind_a_lut_from_the_others(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    handler = _handler(fail={12}) if how == "fails" else _handler(silent={12})
    grid = BatchGrid(list(FLEET), handler)
    strategy = _strategy(tmp_path / "library")
    with caplog.at_level(logging.WARNING, logger="strategies.power_aware"):
        arrays = strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    if how == "fails":
        assert "node 12 failed its slice: node 12 lost its GPU" in caplog.text
    lut = strategy.kind_luts[NANO_KIND]
    assert _lut_cells(lut) == _requested(grid, [11, 13])  # nothing of node 12 is made up
    assert _lut_cells(lut) and not _lut_cells(lut) & (
        _requested(grid, [12]) - _requested(grid, [11, 13])
    )
    # the run goes on: node 12 trains with its kind's LUT (and checks its own cell there)
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    assert {m.metadata.dst_node_id for m in messages} == set(FLEET)
    sent_12 = _kind_lut(strategy, 12)
    assert sent_12 is not None and lut_checksum(sent_12) == lut_checksum(lut)
    strategy.aggregate_train(1, grid.send_and_receive(messages, timeout=5))
    rows = {r.node_id: r for r in strategy.rounds[-1].nodes}
    assert all(r.ok for r in rows.values())
    assert rows[12].shared_time_s == 0.0 and rows[12].shared_energy_j == 0.0
    assert rows[11].shared_time_s > 0 and rows[21].shared_time_s > 0


def test_a_kind_with_no_cell_measured_profiles_its_own_and_is_not_kept(tmp_path: Path) -> None:
    grid = BatchGrid(list(FLEET), _handler(fail={21}))
    strategy = _strategy(tmp_path / "library")
    strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    assert set(strategy.kind_luts) == {NANO_KIND}
    assert _kind_lut(strategy, 21) is None  # the orin profiles its own in TRAIN
    assert strategy.node_config(1, 21).kind_lut is None
    assert LUTLibrary(tmp_path / "library").get(ORIN_KIND) is None
    orin_log = next(e for e in strategy.shared_log if e["kind"] == ORIN_KIND.label)
    assert orin_log["source"].startswith("none")
    # round 2: the nano kind is done; only the orin's kind is asked again
    grid.batches.clear()
    strategy.shared_phase(grid, _zeros(), 2, timeout_s=5)
    assert {m.metadata.dst_node_id for b in grid.profile_batches() for m in b} <= {21}


def test_a_library_hit_costs_no_profiling_in_a_later_run(tmp_path: Path) -> None:
    first = _strategy(tmp_path / "library")
    first.shared_phase(BatchGrid(list(FLEET), _handler()), _zeros(), 1, timeout_s=5)
    grid = BatchGrid(list(FLEET), _handler())
    second = _strategy(tmp_path / "library")  # a new run on the same server cache
    arrays = _zeros()
    assert second.shared_phase(grid, arrays, 1, timeout_s=5) is arrays
    assert grid.sent == []  # no profile exchange at all
    assert {e["source"] for e in second.shared_log} == {"library"}
    for kind in (NANO_KIND, ORIN_KIND):
        assert lut_checksum(second.kind_luts[kind]) == lut_checksum(first.kind_luts[kind])
    sent = _kind_lut(second, 13)
    assert sent is not None and lut_checksum(sent) == lut_checksum(first.kind_luts[NANO_KIND])
    second.aggregate_train(1, [])
    assert second.rounds[-1].shared_round_s == 0.0


def test_a_node_that_joins_later_gets_its_kinds_lut_without_profiling(tmp_path: Path) -> None:
    early = {n: FLEET[n] for n in (11, 12, 21)}
    late = _node("nano-late", NANO, Cap(7.0))
    grid = BatchGrid([11, 12, 21], _handler(fleet={**FLEET, 14: late}))
    strategy = _strategy(tmp_path / "library", fleet=early)

    def evaluate(rnd: int, arrays: ArrayRecord) -> dict[str, float]:
        if rnd == 1:  # connects to the SuperLink after round 1
            grid.node_ids.append(14)
        return {"accuracy": 0.1, "loss": 1.0}

    strategy.run(grid, _zeros(), num_rounds=2, timeout_s=5, evaluate_fn=evaluate)
    round_2 = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN][-4:]
    to_late = [m for m in round_2 if m.metadata.dst_node_id == 14]
    assert len(to_late) == 1, "the node that joined in round 2 is trained in round 2"
    cfg = TrainConfig.from_config(dict(to_late[0].content.config_records["config"]))
    assert cfg.kind_lut is not None
    assert lut_checksum(LUT.from_json(cfg.kind_lut)) == lut_checksum(strategy.kind_luts[NANO_KIND])
    # nobody profiled in round 2: the late node's kind was already known
    profile_rounds = {
        ProfileRequest.from_config(dict(m.content.config_records["config"])).server_round
        for m in grid.sent
        if m.metadata.message_type == PROFILE
    }
    assert profile_rounds == {1}
    assert strategy.rounds[-1].shared_round_s == 0.0


def test_profiled_steps_are_fedavged_into_the_global_model(tmp_path: Path) -> None:
    grid = BatchGrid(list(FLEET), _handler(fail={13}))
    strategy = _strategy(tmp_path / "library", steps_train=True)
    out = strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    expected = np.zeros(3)
    for batch in grid.profile_batches():
        for m in batch:  # each exchange sends the FedAvg of the one before
            np.testing.assert_allclose(
                m.content.array_records["arrays"].to_numpy_ndarrays()[0], expected
            )
        nodes = [m.metadata.dst_node_id for m in batch if m.metadata.dst_node_id != 13]
        weights = np.array([10.0 * n for n in nodes])
        expected = expected + (weights * np.array(nodes, dtype=float)).sum() / weights.sum()
    np.testing.assert_allclose(out.to_numpy_ndarrays()[0], expected)
    assert not np.allclose(expected, 0.0)


class ReversedGrid(BatchGrid):
    """Replies in the reverse of the order they were sent: another arrival order."""

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        return super().send_and_receive(messages, timeout=timeout)[::-1]


def test_profiled_steps_are_fedavged_in_node_name_order_whatever_arrives_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FedAvg's float sums run in one order (the nodes' names, as for TRAIN replies), so a
    run's weights do not depend on which reply came first."""
    orders: list[list[str]] = []
    real = shared_profiling.aggregate_arrayrecords

    def spy(records: list[RecordDict], key: str) -> ArrayRecord:
        # the handler weighs node n's reply 10·n: the weight names the node
        nodes = [round(float(r["metrics"][key]) / 10.0) for r in records]  # type: ignore[arg-type]
        orders.append([FLEET[n].node_name for n in nodes])
        return real(records, key)

    monkeypatch.setattr(shared_profiling, "aggregate_arrayrecords", spy)
    outs = []
    for grid_type in (BatchGrid, ReversedGrid):
        grid = grid_type(list(FLEET), _handler())
        strategy = _strategy(tmp_path / grid_type.__name__, steps_train=True)
        outs.append(strategy.shared_phase(grid, _zeros(), 1, timeout_s=5))
    assert orders and all(o == sorted(o) for o in orders)
    half = len(orders) // 2
    assert orders[:half] == orders[half:]
    np.testing.assert_array_equal(outs[0].to_numpy_ndarrays()[0], outs[1].to_numpy_ndarrays()[0])


def test_synthetic_profiled_steps_leave_the_model_alone(tmp_path: Path) -> None:
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(tmp_path / "library", steps_train=False)
    arrays = _zeros()
    assert strategy.shared_phase(grid, arrays, 1, timeout_s=5) is arrays
    assert all(
        ProfileRequest.from_config(dict(m.content.config_records["config"])).steps_train is False
        for m in grid.sent
    )


def test_shared_costs_are_each_nodes_slices_and_each_exchanges_slowest(tmp_path: Path) -> None:
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(tmp_path / "library")
    arrays = strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    strategy.aggregate_train(1, grid.send_and_receive(messages, timeout=5))
    rep = strategy.rounds[-1]
    per_node: dict[int, float] = {}
    slowest = 0.0
    for batch in grid.profile_batches():
        times = {m.metadata.dst_node_id: 0.1 * len(_cells_of(m)) for m in batch}
        slowest += max(times.values())
        for node, t in times.items():
            per_node[node] = per_node.get(node, 0.0) + t
    assert rep.shared_round_s == pytest.approx(slowest)
    for row in rep.nodes:
        assert row.shared_time_s == pytest.approx(per_node[row.node_id])
        assert row.shared_energy_j == pytest.approx(3 * per_node[row.node_id])
        assert row.to_record()["shared-time-s"] == pytest.approx(per_node[row.node_id])


@pytest.mark.parametrize("method", ["b1", "b2", "fixed"])
def test_baselines_never_profile(tmp_path: Path, method: str) -> None:
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(tmp_path / "library")
    fixed = (16, 614.4) if method == "fixed" else (None, None)
    strategy.template = dataclasses.replace(
        TEMPLATE, method=method, fixed_batch_size=fixed[0], fixed_freq_mhz=fixed[1]
    )
    strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    assert grid.sent == [] and strategy.kind_luts == {}
    assert strategy.node_config(1, 11).kind_lut is None


def test_without_shared_profiling_nothing_is_exchanged(tmp_path: Path) -> None:
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(tmp_path / "library")
    strategy.shared = None
    strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    assert grid.sent == [] and strategy.node_config(1, 11).kind_lut is None
    assert not (tmp_path / "library").exists()


def test_a_late_node_that_never_answers_its_query_is_asked_once(tmp_path: Path) -> None:
    grid = BatchGrid([11, 12], _handler())
    strategy = _strategy(tmp_path / "library", fleet={n: FLEET[n] for n in (11, 12)})

    def evaluate(rnd: int, arrays: ArrayRecord) -> dict[str, float]:
        if rnd == 1:
            grid.node_ids.append(15)  # connected, but its ClientApp never answers
        return {"accuracy": 0.1, "loss": 1.0}

    grid.handler = lambda m: None if m.metadata.dst_node_id == 15 else _handler()(m)
    strategy.run(grid, _zeros(), num_rounds=3, timeout_s=5, evaluate_fn=evaluate)
    asked = [m for m in grid.sent if m.metadata.dst_node_id == 15]
    assert [m.metadata.message_type for m in asked] == [MessageType.QUERY]
    assert strategy.query_failures == {15: "no reply to the QUERY (timeout)"}
    assert [len(rep.ok_nodes) for rep in strategy.rounds] == [2, 2, 2]


def test_a_read_only_library_keeps_the_finished_profiling_for_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(self: LUTLibrary, lut: LUT, source: str) -> Path:
        raise PermissionError(13, "Permission denied", str(self.root))

    monkeypatch.setattr(LUTLibrary, "put", refuse)  # root writes anywhere: the refusal, faked
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(tmp_path / "library")
    with caplog.at_level(logging.WARNING):
        strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    assert set(strategy.kind_luts) == {NANO_KIND, ORIN_KIND}  # the run uses what it measured
    for node in (11, 21):
        assert _kind_lut(strategy, node) is not None
    assert all(e["library"].startswith("not saved: ") for e in strategy.shared_log)
    assert "LUT library: could not save the LUT of" in caplog.text


def test_a_library_lut_a_nodes_round_disagrees_with_is_set_aside_and_profiled_again(
    tmp_path: Path,
) -> None:
    """A library LUT whose numbers are wrong (here: a node's round peaked over its promise
    and set its LUT aside): the library copy is set aside, the run drops it, and the next
    round profiles the kind again, so no fresh node trusts the wrong numbers."""
    first = _strategy(tmp_path / "library")
    first.shared_phase(BatchGrid(list(FLEET), _handler()), _zeros(), 1, timeout_s=5)
    plain = _handler()

    def handle(msg: Message) -> Message | None:
        reply = plain(msg)
        if msg.metadata.message_type == MessageType.TRAIN and msg.metadata.dst_node_id == 13:
            assert reply is not None
            metrics = report(13, num_examples=130.0, lut_set_aside=1.0).to_metrics()
            reply.content["metrics"] = MetricRecord(dict(metrics))
        return reply

    grid = BatchGrid(list(FLEET), handle)
    second = _strategy(tmp_path / "library")  # a later run: the library's LUTs, no profiling
    arrays = second.shared_phase(grid, _zeros(), 1, timeout_s=5)
    assert grid.sent == [] and {e["source"] for e in second.shared_log} == {"library"}
    messages = list(second.configure_train(1, arrays, ConfigRecord(), grid))
    second.aggregate_train(1, grid.send_and_receive(messages, timeout=5))
    nano = next(e for e in second.shared_log if e["kind"] == NANO_KIND.label)
    assert nano["source"] == "library, set aside"
    assert nano["set-aside"].startswith("node 13 peaked over its LUT's promise in round 1")
    library = tmp_path / "library"
    assert LUTLibrary(library).get(NANO_KIND) is None  # set aside, kept for a look
    assert len(list(library.glob("*.corrupt-*"))) == 1
    assert LUTLibrary(library).get(ORIN_KIND) is not None  # the other kind is untouched
    grid.batches.clear()
    second.shared_phase(grid, arrays, 2, timeout_s=5)  # round 2 profiles the nano kind again
    assert {m.metadata.dst_node_id for b in grid.profile_batches() for m in b} == {11, 12, 13}
    assert LUTLibrary(library).get(NANO_KIND) is not None  # the new LUT replaces it
