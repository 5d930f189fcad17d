"""Fleet-shared profiling over Flower (``strategies.shared_exchange``), run by the strategy's
shared phase over a fake Grid: one LUT per kind in the TRAIN configs, slices that fail, a
library hit, a node that joins later, the profiled steps aggregated with the run's
``aggregation``, and what the slices cost."""

from __future__ import annotations

import dataclasses
import logging
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

from fl_client.contract import Cap, NodeDescriptor, ProfileRequest, TrainConfig
from fl_client.lut import LUT, KindKey, lut_checksum
from fl_client.lut_plan import BF
from fl_server.lut_library import LUTLibrary
from fl_server.server_app import Rounds, run_rounds
from strategies import shared_exchange
from strategies.power_aware import PowerAwareFedAvg
from strategies.shared_exchange import SharedProfiling
from tests.strategies.test_power_aware import FakeGrid, report
from tests.strategies.test_shared_profiling import (
    FLEET,
    NANO,
    NANO_KIND,
    ORIN,
    ORIN_KIND,
    SHAPE,
    TEMPLATE,
    B,
    _cells_report,
    _node,
    _twin,
)

pytestmark = pytest.mark.usefixtures("flower_task_identity")

PROFILE = "train.profile"


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


def _cells_of(msg: Message) -> list[BF]:
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
    library: Path,
    fleet: dict[int, NodeDescriptor] = FLEET,
    template: TrainConfig = TEMPLATE,
    aggregation: str = "fedavg",
    **shared: Any,
) -> PowerAwareFedAvg:
    """A strategy with fleet-shared profiling into ``library`` whose QUERY round gave
    ``fleet``."""
    setup = SharedProfiling(library=LUTLibrary(library), input_shape=SHAPE, **shared)
    strategy = PowerAwareFedAvg(
        template=template, min_train_nodes=1, aggregation=aggregation, shared=setup
    )
    strategy.fleet.nodes = dict(fleet)
    return strategy


def _zeros() -> ArrayRecord:
    return ArrayRecord([np.zeros(3)])


def _kind_lut(strategy: PowerAwareFedAvg, node_id: int, server_round: int = 1) -> LUT | None:
    """The kind LUT in ``node_id``'s TRAIN config, as the node parses it."""
    cfg = TrainConfig.from_config(strategy.node_config(server_round, node_id).to_config())
    return None if cfg.kind_lut is None else LUT.from_json(cfg.kind_lut)


def _requested(grid: BatchGrid, nodes: Iterable[int]) -> set[BF]:
    nodes = set(nodes)
    return {
        c
        for batch in grid.profile_batches()
        for m in batch
        if m.metadata.dst_node_id in nodes
        for c in _cells_of(m)
    }


def _lut_cells(lut: LUT) -> set[BF]:
    ii, jj = np.nonzero(~np.isnan(lut.time_per_sample_s))
    return {(lut.batch_sizes[i], lut.knob_values[j]) for i, j in zip(ii, jj, strict=True)}


def test_each_kind_gets_one_lut_of_what_its_nodes_measured_in_its_train_config(
    tmp_path: Path,
) -> None:
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(tmp_path / "library")
    strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    batches = grid.profile_batches()
    assert grid.sent and len(grid.sent) == sum(len(b) for b in batches)  # only profiling
    assert {m.metadata.dst_node_id for m in batches[0]} == set(FLEET)  # the seeds: everyone
    assert 2 <= len(batches) <= 1 + strategy.shared.setup.options.confirm_exchanges  # type: ignore[union-attr]
    assert set(strategy.luts.kind_luts) == {NANO_KIND, ORIN_KIND}
    for kind, nodes, spec in ((NANO_KIND, [11, 12, 13], NANO), (ORIN_KIND, [21], ORIN)):
        lut = strategy.luts.kind_luts[kind]
        assert lut.grid == "shared" and KindKey.of_lut(lut) == kind
        # measured cells only: exactly what its nodes were asked for, each as measured
        assert _lut_cells(lut) == _requested(grid, nodes)
        for b, f in _lut_cells(lut):
            i, j = lut.batch_sizes.index(b), lut.knob_values.index(f)
            assert lut.time_per_sample_s[i, j] == pytest.approx(_twin(spec, (b, f))[0], rel=0.03)
        # every node of the kind gets the same table, and the library keeps it
        for node in nodes:
            sent = _kind_lut(strategy, node)
            assert sent is not None and lut_checksum(sent) == lut_checksum(lut)
        kept = LUTLibrary(tmp_path / "library").get(kind)
        assert kept is not None and lut_checksum(kept) == lut_checksum(lut)
    assert [e["source"] for e in strategy.luts.log] == ["fleet-shared", "fleet-shared"]
    # the nano kind needed fewer cells than its 48
    assert strategy.luts.kind_luts[NANO_KIND].cells_profiled < len(B) * len(NANO.gpu_freqs_mhz) / 3


@pytest.mark.parametrize("how", ["fails", "never answers"])
def test_a_node_whose_slice_fails_leaves_its_kind_a_lut_from_the_others(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    handler = _handler(fail={12}) if how == "fails" else _handler(silent={12})
    grid = BatchGrid(list(FLEET), handler)
    strategy = _strategy(tmp_path / "library")
    with caplog.at_level(logging.WARNING, logger="strategies.shared_exchange"):
        arrays = strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    if how == "fails":
        assert "node 12 failed its slice: node 12 lost its GPU" in caplog.text
    lut = strategy.luts.kind_luts[NANO_KIND]
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
    assert set(strategy.luts.kind_luts) == {NANO_KIND}
    assert _kind_lut(strategy, 21) is None  # the orin profiles its own in TRAIN
    assert strategy.node_config(1, 21).kind_lut is None
    assert LUTLibrary(tmp_path / "library").get(ORIN_KIND) is None
    orin_log = next(e for e in strategy.luts.log if e["kind"] == ORIN_KIND.label)
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
    assert {e["source"] for e in second.luts.log} == {"library"}
    for kind in (NANO_KIND, ORIN_KIND):
        assert lut_checksum(second.luts.kind_luts[kind]) == lut_checksum(first.luts.kind_luts[kind])
    sent = _kind_lut(second, 13)
    assert sent is not None and lut_checksum(sent) == lut_checksum(first.luts.kind_luts[NANO_KIND])
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

    run_rounds(strategy, grid, _zeros(), Rounds(num_rounds=2, timeout_s=5), evaluate)
    round_2 = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN][-4:]
    to_late = [m for m in round_2 if m.metadata.dst_node_id == 14]
    assert len(to_late) == 1, "the node that joined in round 2 is trained in round 2"
    cfg = TrainConfig.from_config(dict(to_late[0].content.config_records["config"]))
    assert cfg.kind_lut is not None
    assert lut_checksum(LUT.from_json(cfg.kind_lut)) == lut_checksum(
        strategy.luts.kind_luts[NANO_KIND]
    )
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


def _with_work(handler: Callable[[Message], Message | None]) -> Callable[[Message], Message | None]:
    """``handler``'s nodes, reporting their profiled steps' work: node n took n % 3 + 1
    steps at lr 0.01 (unequal work)."""

    def handle(msg: Message) -> Message | None:
        reply = handler(msg)
        if msg.metadata.message_type != PROFILE or reply is None or reply.has_error():
            return reply
        node = msg.metadata.dst_node_id
        metrics = dict(reply.content.metric_records["metrics"])
        metrics.update({"local-steps": float(node % 3 + 1), "local-lr": 0.01})
        reply.content["metrics"] = MetricRecord(metrics)
        return reply

    return handle


def test_with_fednova_profiled_steps_are_normalised_by_each_nodes_work(tmp_path: Path) -> None:
    """The profiled updates go through the run's aggregation (``aggregate_round``), as a
    TRAIN round's: with fednova, each node's update is divided by its work."""
    grid = BatchGrid(list(FLEET), _with_work(_handler(fail={13})))
    strategy = _strategy(tmp_path / "library", aggregation="fednova", steps_train=True)
    out = strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    expected = fedavg = np.zeros(3)
    for batch in grid.profile_batches():
        nodes = [m.metadata.dst_node_id for m in batch if m.metadata.dst_node_id != 13]
        p = np.array([10.0 * n for n in nodes]) / sum(10.0 * n for n in nodes)
        work = np.array([0.01 * (n % 3 + 1) for n in nodes])
        # x + τ_eff · Σ p_i Δ_i / a_i, τ_eff = Σ p_i a_i; node n's update Δ_n is n
        expected = expected + (p @ work) * (p * np.array(nodes) / work).sum()
        fedavg = fedavg + (p * np.array(nodes)).sum()
    assert len(grid.profile_batches()) >= 2
    np.testing.assert_allclose(out.to_numpy_ndarrays()[0], expected)
    assert not np.allclose(expected, fedavg)  # unequal work: not what FedAvg gives
    assert strategy.luts.warnings == []


def test_with_fednova_profiled_steps_without_their_work_are_fedavged_and_the_round_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nodes that do not report their profiled steps' work (``local-steps``, ``local-lr``)
    leave FedNova nothing to normalise by: the exchange falls back to FedAvg, as a TRAIN
    round does, and the round's record carries the warning."""
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(tmp_path / "library", aggregation="fednova", steps_train=True)
    with caplog.at_level(logging.WARNING, logger="strategies.shared_exchange"):
        arrays = strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    fedavg = _strategy(tmp_path / "other", steps_train=True)
    same = fedavg.shared_phase(BatchGrid(list(FLEET), _handler()), _zeros(), 1, timeout_s=5)
    np.testing.assert_array_equal(arrays.to_numpy_ndarrays()[0], same.to_numpy_ndarrays()[0])
    warning = (
        "shared profiling: aggregation: fednova: 4 of 4 nodes reported no local-steps and "
        "local-lr; round 1 aggregated with FedAvg"
    )
    assert len(grid.profile_batches()) >= 2  # each exchange fell back: one warning says so
    assert strategy.luts.warnings == [warning]
    assert caplog.text.count(warning.split(": ", 1)[1]) == 1
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    strategy.aggregate_train(1, grid.send_and_receive(messages, timeout=5))
    assert warning in strategy.rounds[-1].warnings


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
    real = shared_exchange.aggregate_round

    def spy(
        mode: str, base: ArrayRecord, records: list[RecordDict], key: str, rnd: int
    ) -> tuple[ArrayRecord, str | None]:
        # the handler weighs node n's reply 10·n: the weight names the node
        nodes = [round(float(r["metrics"][key]) / 10.0) for r in records]  # type: ignore[arg-type]
        orders.append([FLEET[n].node_name for n in nodes])
        return real(mode, base, records, key, rnd)

    monkeypatch.setattr(shared_exchange, "aggregate_round", spy)
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


def test_per_node_profiled_steps_continue_each_nodes_own_and_are_kept_apart(
    tmp_path: Path,
) -> None:
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(tmp_path / "library", steps_train=True, per_node=True)
    arrays = _zeros()
    assert strategy.shared_phase(grid, arrays, 1, timeout_s=5) is arrays  # nothing averaged
    sent: dict[int, int] = {}
    for batch in grid.profile_batches():
        for m in batch:
            sent[m.metadata.dst_node_id] = sent.get(m.metadata.dst_node_id, 0) + 1
    assert any(n > 1 for n in sent.values())  # some node took part in several exchanges
    trained = strategy.luts.trained
    assert set(trained) == set(sent)
    for node, times in sent.items():
        # the handler adds the node's id to what it receives: from its own arrays each time
        np.testing.assert_array_equal(trained[node][0].to_numpy_ndarrays()[0], node * times)
        assert trained[node][1] == pytest.approx(10.0 * node * times)


def test_each_kinds_lut_is_merged_after_its_own_slowest_nodes_slices(tmp_path: Path) -> None:
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(tmp_path / "library")
    strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    luts = strategy.luts
    kind_s: dict[KindKey, float] = {}
    for batch in grid.profile_batches():
        slowest: dict[KindKey, float] = {}
        for m in batch:
            kind = luts.kind_of[m.metadata.dst_node_id]
            slowest[kind] = max(slowest.get(kind, 0.0), 0.1 * len(_cells_of(m)))
        for kind, t in slowest.items():
            kind_s[kind] = kind_s.get(kind, 0.0) + t
    assert len(kind_s) >= 2  # the fleet has kinds that profile apart
    assert luts.kind_s == pytest.approx(kind_s)
    assert max(luts.kind_s.values()) <= luts.round_s + 1e-12


@pytest.mark.parametrize("method", ["b1", "b2", "fixed"])
def test_baselines_never_profile(tmp_path: Path, method: str) -> None:
    grid = BatchGrid(list(FLEET), _handler())
    fixed = (16, 614.4) if method == "fixed" else (None, None)
    template = dataclasses.replace(
        TEMPLATE, method=method, fixed_batch_size=fixed[0], fixed_freq_mhz=fixed[1]
    )
    strategy = _strategy(tmp_path / "library", template=template)
    strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    assert grid.sent == [] and strategy.luts.kind_luts == {}
    assert strategy.node_config(1, 11).kind_lut is None


def test_without_shared_profiling_nothing_is_exchanged(tmp_path: Path) -> None:
    grid = BatchGrid(list(FLEET), _handler())
    strategy = PowerAwareFedAvg(template=TEMPLATE, min_train_nodes=1)
    strategy.fleet.nodes = dict(FLEET)
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
    run_rounds(strategy, grid, _zeros(), Rounds(num_rounds=3, timeout_s=5), evaluate)
    asked = [m for m in grid.sent if m.metadata.dst_node_id == 15]
    assert [m.metadata.message_type for m in asked] == [MessageType.QUERY]
    assert strategy.fleet.query_failures == {15: "no reply to the QUERY (timeout)"}
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
    assert set(strategy.luts.kind_luts) == {NANO_KIND, ORIN_KIND}  # the run uses what it measured
    for node in (11, 21):
        assert _kind_lut(strategy, node) is not None
    assert all(e["library"].startswith("not saved: ") for e in strategy.luts.log)
    assert "LUT library: could not save the LUT of" in caplog.text
    assert "make the library folder writable" in caplog.text


def test_a_name_the_library_refuses_is_named_as_the_reason_not_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(self: LUTLibrary, lut: LUT, source: str) -> Path:
        unsafe = dataclasses.replace(KindKey.of_lut(lut), model_name="..")
        return self.path_for(unsafe)  # the library's own refusal of a name

    monkeypatch.setattr(LUTLibrary, "put", refuse)
    strategy = _strategy(tmp_path / "library")
    with caplog.at_level(logging.WARNING):
        strategy.shared_phase(BatchGrid(list(FLEET), _handler()), _zeros(), 1, timeout_s=5)
    assert set(strategy.luts.kind_luts) == {NANO_KIND, ORIN_KIND}  # the run uses what it measured
    assert all("model-name" in e["library"] for e in strategy.luts.log)
    assert "refuses the kind's device kind, backend or model name" in caplog.text
    assert "writable" not in caplog.text.replace("a writable folder would not help", "")


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
    assert grid.sent == [] and {e["source"] for e in second.luts.log} == {"library"}
    messages = list(second.configure_train(1, arrays, ConfigRecord(), grid))
    second.aggregate_train(1, grid.send_and_receive(messages, timeout=5))
    nano = next(e for e in second.luts.log if e["kind"] == NANO_KIND.label)
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


def _profiled(library: Path, **shared: Any) -> tuple[BatchGrid, PowerAwareFedAvg]:
    """A strategy whose fleet-shared profiling with trained, per-node profiled steps
    (``shared``: more ``SharedProfiling`` settings) has run on a fresh grid."""
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(library, steps_train=True, per_node=True, **shared)
    strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    return grid, strategy


def test_a_node_done_before_its_kinds_lut_trains_in_the_gap_from_its_own_arrays(
    tmp_path: Path,
) -> None:
    grid, strategy = _profiled(tmp_path / "library")
    luts = strategy.luts
    assert strategy.shared is not None
    kind_luts = {k: lut.to_json() for k, lut in luts.kind_luts.items()}
    profiled = dict(luts.trained)
    exchanges = len(grid.profile_batches())
    strategy.shared.train_while_waiting(grid, 1, timeout_s=5)
    assert len(grid.profile_batches()) == exchanges + 1  # one exchange more
    sent = {m.metadata.dst_node_id: m for m in grid.profile_batches()[-1]}
    gaps = {n: luts.kind_s[luts.kind_of[n]] - luts.cost[n][0] for n in FLEET}
    assert 21 not in sent and gaps[21] == pytest.approx(0.0)  # its kind's only node
    assert sent and set(sent) <= {n for n, gap in gaps.items() if gap > 0}
    for node, msg in sent.items():
        req = ProfileRequest.from_config(dict(msg.content.config_records["config"]))
        assert (req.warmup_steps, req.steps_train, len(req.cells)) == (0, True, 1)
        # the fastest cell under its cap of the first slices it knows of when its own end
        # (its own, and those of its kind that ended before), the steps that fit in its gap
        tps = _feasible_known(luts, node, luts.cost[node][0])
        assert tps  # each node of this fleet has a feasible cell of its own
        cell = min(tps, key=lambda c: tps[c])
        assert req.cells == [cell]
        assert req.steps == int(gaps[node] // (tps[cell] * cell[0]))
        # from its own profiled arrays (the handler adds the node's id), its examples added
        own = profiled[node][0].to_numpy_ndarrays()[0]
        np.testing.assert_array_equal(luts.trained[node][0].to_numpy_ndarrays()[0], own + node)
        assert luts.trained[node][1] == pytest.approx(profiled[node][1] + 10.0 * node)
        waited = luts.waiting_train[node]
        assert (waited.start_s, waited.cell, waited.steps) == (luts.cost[node][0], cell, req.steps)
        assert (waited.time_s, waited.energy_j) == pytest.approx((0.1, 0.3))  # the handler's
    assert set(luts.waiting_train) == set(sent)
    # the kinds' LUTs are what the profiling measured: the steps in the gap add no cell
    assert {k: lut.to_json() for k, lut in luts.kind_luts.items()} == kind_luts


def _feasible_known(luts: Any, node: int, at_s: float) -> dict[BF, float]:
    """The time per sample of each cell of ``node``'s kind's first slices known at ``at_s``
    (its own, and every other that ended by then) whose peak is under its cap."""
    limit = FLEET[node].p_max.with_margin(FLEET[node].cap_margin)
    return {
        (b, f): v[0]
        for n, report in luts.first_slice.items()
        if luts.kind_of[n] == luts.kind_of[node] and (n == node or report.profile_time_s <= at_s)
        for b, f, v in report.measurements()
        if v[1] < limit.limit_w
    }


def test_a_node_with_no_feasible_cell_of_its_own_waits_for_one_of_its_kind(
    tmp_path: Path,
) -> None:
    grid, strategy = _profiled(tmp_path / "library")
    luts = strategy.luts
    nanos = sorted(n for n in FLEET if luts.kind_of[n] == NANO_KIND)
    node = min(nanos, key=lambda n: luts.cost[n][0])  # done first: the longest gap
    own = luts.first_slice[node]
    # its own cells all over every cap: it has nothing of its own to train at
    luts.first_slice[node] = dataclasses.replace(own, peak_power_w=(100.0,) * len(own.cells_b))
    assert not _feasible_known(luts, node, luts.cost[node][0])
    strategy.shared.train_while_waiting(grid, 1, timeout_s=5)  # type: ignore[union-attr]
    waited = luts.waiting_train[node]
    # it starts when the first other slice that brings a feasible cell ends, and trains at
    # the fastest feasible cell known then
    ends = sorted(luts.first_slice[n].profile_time_s for n in nanos if n != node)
    assert waited.start_s in ends and waited.start_s > luts.cost[node][0]
    assert not any(_feasible_known(luts, node, t) for t in ends if t < waited.start_s)
    tps = _feasible_known(luts, node, waited.start_s)
    assert waited.cell == min(tps, key=lambda c: tps[c])
    gap_s = luts.kind_s[NANO_KIND] - waited.start_s
    assert waited.steps == int(gap_s // (tps[waited.cell] * waited.cell[0]))


def test_a_node_that_fails_its_steps_in_the_gap_keeps_its_profiled_update(
    tmp_path: Path,
) -> None:
    _, strategy = _profiled(tmp_path / "library")
    assert strategy.shared is not None
    profiled = dict(strategy.luts.trained)
    strategy.shared.train_while_waiting(
        BatchGrid(list(FLEET), _handler(fail=FLEET)), 1, timeout_s=5
    )
    assert strategy.luts.waiting_train == {}
    assert strategy.luts.trained == profiled


def test_without_per_node_profiled_updates_no_node_trains_in_the_gap(tmp_path: Path) -> None:
    grid = BatchGrid(list(FLEET), _handler())
    strategy = _strategy(tmp_path / "library", steps_train=True)
    strategy.shared_phase(grid, _zeros(), 1, timeout_s=5)
    assert strategy.shared is not None
    exchanges = len(grid.profile_batches())
    strategy.shared.train_while_waiting(grid, 1, timeout_s=5)
    assert len(grid.profile_batches()) == exchanges
    assert strategy.luts.waiting_train == {}


def test_while_waiting_idle_sends_nothing_after_the_profiling(tmp_path: Path) -> None:
    grid, strategy = _profiled(tmp_path / "library", waiting="idle")
    assert strategy.shared is not None
    exchanges, profiled = len(grid.profile_batches()), dict(strategy.luts.trained)
    strategy.shared.train_while_waiting(grid, 1, timeout_s=5)
    assert len(grid.profile_batches()) == exchanges
    assert strategy.luts.waiting_train == {} and strategy.luts.trained == profiled
