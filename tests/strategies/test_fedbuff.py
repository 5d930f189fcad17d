"""FedBuff's core as pure code: the virtual clock's order on a fake fleet with fixed device
times, the staleness weights, and the buffer's step against a hand computation."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pytest

from fl_client.settings_table import RUN, STALENESS_FORMS
from strategies.fedbuff import DeviceCost, VirtualClock, apply_buffer, staleness_weight

#: A fake fleet: node id -> device time of every work (s)
TIMES = {1: 3.0, 2: 1.0, 3: 2.0}


def drive(
    times: dict[int, float], buffer_size: int, steps: int, reply_order: Iterable[int] = ()
) -> list[tuple[int, float, float, int, int | None, int | None]]:
    """Run the clock on ``times`` for ``steps`` updates, every reply fed at once (first
    ``reply_order``'s nodes, as a host might deliver them); return per update taken
    (node, start, end, base version, version applied, staleness)."""
    clock = VirtualClock(buffer_size, "inverse-sqrt")
    order = [*reply_order, *(n for n in sorted(times) if n not in reply_order)]
    works = [clock.dispatch(n, 0.0) for n in sorted(times)]
    for n in order:
        clock.arrive(n, DeviceCost(times[n], 1.0), samples=10.0)
    assert len(works) == len(times)
    taken: dict[tuple[int, int], list] = {}
    out = []
    for _ in range(steps):
        step = clock.step()
        assert step is not None
        u = step.update
        row = [u.node_id, u.work.start_s, u.end_s, u.work.base_version, None, None]
        out.append(row)
        taken[(u.node_id, u.work.number)] = row
        for a in step.applied:
            row_a = taken[(a.update.node_id, a.update.work.number)]
            row_a[4], row_a[5] = a.version, a.staleness
        clock.dispatch(u.node_id, u.end_s)
        clock.arrive(u.node_id, DeviceCost(times[u.node_id], 1.0), samples=10.0)
    return [tuple(r) for r in out]  # type: ignore[misc]


def test_updates_are_taken_in_device_time_order_ties_by_first_dispatch() -> None:
    # Worked by hand (node 1 takes 3 s, node 2 1 s, node 3 2 s; K = 2): node 2 ends at 1
    # and again at 2, both from version 0: version 1 at t=2. Node 3 (ends 2) and node 1
    # (ends 3, before node 2's third work, also ending 3: the lower id) make version 2 at
    # t=3, each one version stale. Node 2's third work (from version 1) and its fourth
    # (from version 2, ending 4: before node 3's second, also ending 4) make version 3.
    got = drive(TIMES, buffer_size=2, steps=6)
    assert got == [
        (2, 0.0, 1.0, 0, 1, 0),
        (2, 1.0, 2.0, 0, 1, 0),  # (2.0, node 2) before (2.0, node 3)
        (3, 0.0, 2.0, 0, 2, 1),
        (1, 0.0, 3.0, 0, 2, 1),  # (3.0, node 1) before (3.0, node 2)
        (2, 2.0, 3.0, 1, 3, 1),
        (2, 3.0, 4.0, 2, 3, 0),  # (4.0, node 2) before (4.0, node 3)
    ]


def test_the_order_is_the_devices_whatever_order_the_host_delivers_replies_in() -> None:
    assert drive(TIMES, 2, 8) == drive(TIMES, 2, 8, reply_order=[3, 1, 2])


def test_a_tie_goes_to_the_node_sent_its_first_work_first_not_the_lower_id() -> None:
    clock = VirtualClock(3, "constant")
    for n in (5, 2, 9):  # the caller's order (the fleet's names), not Flower's ids
        clock.dispatch(n, 0.0)
    for n in (9, 2, 5):
        clock.arrive(n, DeviceCost(1.0, 1.0), samples=1.0)
    taken = []
    while (step := clock.step()) is not None:
        taken.append(step.update.node_id)
    assert taken == [5, 2, 9]


def test_no_update_is_taken_while_a_reply_is_in_flight() -> None:
    clock = VirtualClock(1, "constant")
    clock.dispatch(1, 0.0)
    clock.dispatch(2, 0.0)
    clock.arrive(2, DeviceCost(1.0, 1.0), samples=1.0)
    with pytest.raises(RuntimeError, match=r"nodes \[1\] have not replied"):
        clock.step()
    clock.arrive(1, DeviceCost(5.0, 1.0), samples=1.0)
    step = clock.step()
    assert step is not None and step.update.node_id == 2 and step.version == 1
    assert clock.now_s == 1.0


def test_arrival_takes_updates_in_the_order_they_arrived_while_others_are_in_flight() -> None:
    clock = VirtualClock(2, "constant", "arrival")
    for n in (1, 2, 3):
        clock.dispatch(n, 0.0)
    clock.arrive(1, DeviceCost(5.0, 1.0), samples=1.0, wall_s=1.0)
    clock.arrive(2, DeviceCost(1.0, 1.0), samples=1.0, wall_s=2.0)  # earlier device end
    assert clock.has_pending
    first = clock.step()  # node 3 still in flight: no wait under arrival
    assert first is not None and first.update.node_id == 1 and first.update.wall_s == 1.0
    assert clock.now_s == 5.0
    second = clock.step()
    assert second is not None and second.update.node_id == 2 and second.version == 1
    assert clock.now_s == 5.0  # a version's virtual time: the latest end taken so far
    assert not clock.has_pending and clock.step() is None
    assert clock.waiting == {3}


def test_drain_hands_back_the_replies_not_taken_and_in_flight_names_the_rest() -> None:
    clock = VirtualClock(2, "constant", "arrival")
    works = [clock.dispatch(n, 0.0) for n in (3, 1, 2)]
    clock.arrive(2, DeviceCost(1.0, 1.0), samples=1.0, wall_s=1.0)
    clock.arrive(1, DeviceCost(2.0, 1.0), samples=1.0, wall_s=2.0)
    assert [u.node_id for u in clock.drain()] == [2, 1]  # in the order they arrived
    assert not clock.has_pending and clock.step() is None and clock.buffer == []
    assert clock.in_flight == (works[0],)  # node 3, still training
    clock.drop(3)
    assert clock.in_flight == ()


def test_a_node_whose_work_is_in_flight_is_not_idle() -> None:
    clock = VirtualClock(1, "constant", "arrival")
    for n in (1, 2):
        clock.dispatch(n, 0.0)
    clock.arrive(1, DeviceCost(2.0, 4.0, idle_power_w=1.0), samples=1.0)
    assert clock.step() is not None and clock.now_s == 2.0
    times = clock.account(0.0, 2.0)
    assert times[1].busy_s == 2.0 and times[1].idle_s == 0.0
    # node 2 trains since 0: not idle, and its time is unknown until it replies
    assert times[2].busy_s == 0.0 and times[2].idle_s == 0.0
    clock.arrive(2, DeviceCost(3.0, 3.0, idle_power_w=1.0), samples=1.0)
    assert clock.account(0.0, 2.0)[2].busy_s == 2.0  # known now


def test_an_unknown_ordering_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"ordering: unknown 'wall'; allowed: virtual, arrival"):
        VirtualClock(2, "constant", "wall")


def test_a_dropped_node_gets_no_more_work_and_the_others_go_on() -> None:
    clock = VirtualClock(2, "constant")
    for n in (1, 2):
        clock.dispatch(n, 0.0)
    clock.drop(1)
    clock.arrive(2, DeviceCost(1.0, 1.0), samples=1.0)
    assert clock.step() is not None  # buffered, no version yet
    assert clock.version == 0
    clock.dispatch(2, 1.0)
    clock.arrive(2, DeviceCost(1.0, 1.0), samples=1.0)
    step = clock.step()
    assert step is not None and clock.version == 1 and len(step.applied) == 2
    assert clock.step() is None  # nothing pending


@pytest.mark.parametrize(
    ("form", "staleness", "expected"),
    [
        ("inverse-sqrt", 0, 1.0),
        ("inverse-sqrt", 3, 0.5),
        ("inverse", 3, 0.25),
        ("constant", 7, 1.0),
    ],
)
def test_staleness_weight_forms(form: str, staleness: int, expected: float) -> None:
    assert staleness_weight(form, staleness) == pytest.approx(expected)


def test_every_form_the_setting_allows_has_a_weight_and_the_default_is_one_of_them() -> None:
    assert RUN["staleness-weight"].default in STALENESS_FORMS
    for form in STALENESS_FORMS:
        assert 0.0 < staleness_weight(form, 2) <= 1.0


def test_an_unknown_staleness_form_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"staleness-weight: unknown form 'sqrt'.*inverse-sqrt"):
        staleness_weight("sqrt", 1)
    with pytest.raises(ValueError, match="staleness-weight"):
        VirtualClock(2, "sqrt")
    with pytest.raises(ValueError, match="buffer-size"):
        VirtualClock(0, "constant")


def test_the_weight_is_samples_times_the_staleness_factor() -> None:
    got = drive(TIMES, 2, 4)
    assert got[3][5] == 1  # node 1's update had staleness 1
    clock = VirtualClock(2, "inverse")
    clock.dispatch(1, 0.0)
    clock.dispatch(2, 0.0)
    clock.arrive(1, DeviceCost(1.0, 0.0), samples=30.0)
    clock.arrive(2, DeviceCost(2.0, 0.0), samples=40.0)
    clock.step()
    step = clock.step()
    assert step is not None
    assert [a.weight for a in step.applied] == [30.0, 40.0]  # both staleness 0


def test_rate_weight_weighs_an_update_by_its_training_time_over_the_fleets_mean() -> None:
    # Training times 1, 2 and 3 s (mean 2 s); node 1 updates first and again (K = 2):
    # factors 1/2 and 1/2, a buffer of two fast updates gets half a step.
    clock = VirtualClock(2, "constant", rate_weight="device-time")
    for n in (1, 2, 3):
        clock.dispatch(n, 0.0)
    for n, t in ((1, 1.0), (2, 2.0), (3, 3.0)):
        clock.arrive(n, DeviceCost(t, 0.0), samples=10.0)
    assert clock.step() is not None
    clock.dispatch(1, 1.0)
    clock.arrive(1, DeviceCost(1.0, 0.0), samples=10.0)
    step = clock.step()  # node 1 (ends at 2) and node 2 (ends at 2): ties by first dispatch
    assert step is not None and [a.update.node_id for a in step.applied] == [1, 1]
    assert [a.weight for a in step.applied] == [5.0, 5.0] and step.scale == 0.5
    clock.dispatch(1, 2.0)
    clock.arrive(1, DeviceCost(1.0, 0.0), samples=10.0)
    assert clock.step() is not None  # node 2 (ends at 2) into the buffer
    step = clock.step()  # node 1's third and node 3 both end at 3: node 1 (first dispatched)
    assert step is not None
    # node 2 10 × 2/2 and node 1 10 × 1/2: 15 of the floor's 20, three quarters of a step
    assert [(a.update.node_id, a.weight) for a in step.applied] == [(2, 10.0), (1, 5.0)]
    assert step.scale == 0.75
    clock.dispatch(1, 3.0)
    clock.arrive(1, DeviceCost(1.0, 0.0), samples=10.0)
    clock.dispatch(2, 2.0)
    clock.arrive(2, DeviceCost(2.0, 0.0), samples=10.0)
    assert clock.step() is not None  # node 3 (ends at 3, 3 s of training)
    step = clock.step()  # node 1 (ends at 4) before node 2 (ends at 4): node 1
    assert step is not None
    # node 3 10 × 3/2 and node 1 10 × 1/2: 20, the floor, a full step (a slow node's
    # update weighs more than a fast one's in the mean)
    assert [(a.update.node_id, a.weight) for a in step.applied] == [(3, 15.0), (1, 5.0)]
    assert step.scale == 1.0


def test_rate_weight_leaves_out_profiling_and_nodes_that_dropped() -> None:
    clock = VirtualClock(1, "constant", rate_weight="device-time")
    for n in (1, 2, 3):
        clock.dispatch(n, 0.0)
    clock.arrive(1, DeviceCost(5.0, 0.0, profile_time_s=4.0), samples=1.0)  # trains 1 s
    clock.arrive(2, DeviceCost(3.0, 0.0), samples=1.0)
    clock.drop(3)
    # mean training time of the nodes in the run: (1 + 3) / 2 = 2 s (node 3 left out)
    step = clock.step()  # node 2 ends at 3 s, before node 1 (5 s, 4 of them profiling)
    assert step is not None and step.applied[0].weight == 1.5 and step.scale == 1.0
    step = clock.step()
    assert step is not None and step.applied[0].weight == 0.5 and step.scale == 0.5
    with pytest.raises(ValueError, match="rate-weight"):
        VirtualClock(1, "constant", rate_weight="fast")


def test_the_fleet_step_moves_by_the_buffers_share_of_the_fleets_samples() -> None:
    # Four nodes in the run, three replied so far with 10, 20 and 30 samples (mean 20): a
    # round's weight is 4 × 20 = 80. K = 2: the first two updates (10 + 20) make 30/80.
    clock = VirtualClock(2, "constant", buffer_step="fleet")
    for n in (1, 2, 3, 4):
        clock.dispatch(n, 0.0)
    for n, t, samples in ((1, 1.0, 10.0), (2, 2.0, 20.0), (3, 3.0, 30.0), (4, 4.0, 20.0)):
        clock.arrive(n, DeviceCost(t, 0.0), samples)
    clock.step()
    step = clock.step()
    assert step is not None and [a.weight for a in step.applied] == [10.0, 20.0]
    assert step.scale == pytest.approx(30.0 / 80.0)
    # with every node's update in one buffer (K = N, staleness 0) it is FedAvg: a full step
    clock = VirtualClock(4, "constant", buffer_step="fleet")
    for n in (1, 2, 3, 4):
        clock.dispatch(n, 0.0)
        clock.arrive(n, DeviceCost(1.0, 0.0), 10.0 * n)
    steps = [clock.step() for _ in range(4)]
    assert steps[-1] is not None and steps[-1].scale == 1.0
    with pytest.raises(ValueError, match="buffer-step"):
        VirtualClock(1, "constant", buffer_step="half")


def test_with_the_fleet_step_staleness_weighs_updates_against_each_other_only() -> None:
    # Two nodes of 10 samples each (a round's weight: 20), K = 1, s(τ) = 1/√(1+τ). Node 1
    # updates twice while node 2's first work runs: node 2's update is one version stale,
    # yet it moves the model by its full share, 10/20, as in a round.
    clock = VirtualClock(1, "inverse-sqrt", buffer_step="fleet")
    for n in (1, 2):
        clock.dispatch(n, 0.0)
    clock.arrive(1, DeviceCost(1.0, 0.0), 10.0)
    clock.arrive(2, DeviceCost(1.5, 0.0), 10.0)
    first = clock.step()  # node 1 at 1 s: version 1
    assert first is not None and first.scale == pytest.approx(0.5)
    clock.dispatch(1, 1.0)
    clock.arrive(1, DeviceCost(1.0, 0.0), 10.0)
    stale = clock.step()  # node 2 at 1.5 s, from version 0: staleness 1
    assert stale is not None and stale.applied[0].staleness == 1
    assert stale.applied[0].weight == pytest.approx(10.0 / math.sqrt(2.0))
    assert stale.scale == pytest.approx(0.5)
    # in one buffer a fresh and a stale update share the step by their staleness weights
    clock = VirtualClock(2, "inverse-sqrt", buffer_step="fleet")
    for n in (1, 2, 3):
        clock.dispatch(n, 0.0)
    for n, t in ((1, 1.0), (2, 3.0), (3, 3.5)):
        clock.arrive(n, DeviceCost(t, 0.0), 10.0)
    clock.dispatch(1, 1.0)
    clock.arrive(1, DeviceCost(1.0, 0.0), 10.0)
    clock.step()
    assert clock.step() is not None  # node 1 twice (1 s, 2 s): version 1, 20 of 30
    clock.dispatch(1, 2.0)
    clock.arrive(1, DeviceCost(2.0, 0.0), 10.0)
    clock.step()  # node 2 at 3 s, stale by 1
    step = clock.step()  # node 3 at 3.5 s, stale by 1
    assert step is not None
    assert [a.weight for a in step.applied] == pytest.approx([10 / math.sqrt(2)] * 2)
    assert step.scale == pytest.approx(20.0 / 30.0)


def test_the_step_can_be_shortened_never_lengthened() -> None:
    g = {"w": np.array([1.0, 2.0])}
    local = {"w": np.array([3.0, 0.0])}
    np.testing.assert_allclose(apply_buffer(g, [(local, g, 1.0)], 0.25)["w"], [1.5, 1.5])
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="scale"):
            apply_buffer(g, [(local, g, 1.0)], bad)


def test_the_buffer_step_matches_a_hand_computation() -> None:
    g: dict[str, np.ndarray] = {
        "w": np.array([1.0, 1.0], dtype=np.float32),
        "n": np.array(10, dtype=np.int64),
    }
    base0 = {"w": np.array([0.0, 0.0]), "n": np.array(8)}
    base1 = {"w": np.array([1.0, 1.0]), "n": np.array(10)}
    local_a = {"w": np.array([2.0, 0.0]), "n": np.array(9)}  # delta (2, 0), n +1
    local_b = {"w": np.array([1.0, 4.0]), "n": np.array(13)}  # delta (0, 3), n +3
    new = apply_buffer(g, [(local_a, base0, 1.0), (local_b, base1, 3.0)])
    # (1·(2, 0) + 3·(0, 3)) / 4 = (0.5, 2.25); n: (1·1 + 3·3) / 4 = 2.5 → 10 + 2.5 → 12
    np.testing.assert_allclose(new["w"], [1.5, 3.25])
    assert new["w"].dtype == np.float32
    assert int(new["n"]) == 12 and new["n"].dtype == np.int64


def test_one_update_from_the_current_version_is_that_update() -> None:
    g = {"w": np.array([1.0, 2.0])}
    local = {"w": np.array([4.0, -1.0])}
    np.testing.assert_allclose(apply_buffer(g, [(local, g, 5.0)])["w"], local["w"])
    with pytest.raises(ValueError, match="empty"):
        apply_buffer(g, [])


def test_a_node_that_replied_counts_no_idle_before_its_next_work_is_sent() -> None:
    # ordered by arrival: node 1 (0..1 s) is taken, node 2 (0..3 s) makes the version at
    # 3 s, and node 1's next work, sent from its end, is not known yet
    clock = VirtualClock(2, "constant", "arrival")
    for n in (1, 2):
        clock.dispatch(n, 0.0)
    clock.arrive(1, DeviceCost(1.0, 2.0, idle_power_w=1.0), samples=1.0)
    clock.arrive(2, DeviceCost(3.0, 3.0, idle_power_w=1.0), samples=1.0)
    assert clock.step() is not None and clock.step() is not None and clock.now_s == 3.0
    before = clock.account(0.0, 3.0)[1]
    assert (before.busy_s, before.idle_s) == (1.0, 0.0)  # 1..3 s: not idle, not known yet
    clock.dispatch(1, 1.0)
    clock.arrive(1, DeviceCost(1.5, 3.0, idle_power_w=1.0), samples=1.0)  # 1..2.5 s
    after = clock.account(0.0, 3.0)[1]
    assert (after.busy_s, after.idle_s) == (2.5, 0.0)  # what is known only grows
    assert clock.account(0.0, 3.0)[2].idle_s == 0.0


def test_the_account_splits_busy_profiling_and_idle_time_in_an_interval() -> None:
    clock = VirtualClock(1, "constant")
    clock.add_busy(1, 0.0, DeviceCost(1.0, 2.0, 1.0, 2.0))  # shared profiling, 0..1
    clock.dispatch(1, 2.0)  # idle 1..2
    clock.arrive(1, DeviceCost(2.0, 4.0, idle_power_w=0.5), samples=1.0)  # busy 2..4
    t = clock.account(0.0, 3.0)[1]
    assert (t.busy_s, t.busy_j) == (2.0, 4.0)  # 1 s profiling + half the work's 4 J
    assert (t.profile_s, t.profile_j) == (1.0, 2.0)
    assert (t.idle_s, t.idle_j) == (1.0, 0.5)
    whole = clock.account(0.0, 4.0)[1]
    assert whole.idle_s == 1.0 and math.isclose(whole.busy_j, 6.0)
