"""A round's aggregation of the nodes' arrays, by the run setting ``aggregation``.

* ``fedavg``: Flower's weighted average (``aggregate_arrayrecords``), weighted by each
  reply's ``num-examples``; what every run did before this setting.
* ``fednova``: FedNova's normalised averaging (``strategies.fednova``) of the arrays the
  local optimiser moves, with each node's work from its reply (``local-steps`` ×
  ``local-lr``: Adam, whose bias-corrected first moment sums its gradient weights to the
  step count, see ``strategies.fednova``); the rest (BatchNorm's running statistics and
  step counter, integer arrays) averaged as FedAvg does. A round whose nodes did equal
  work is FedAvg exactly (Flower's code, the same floats). A round in which a node did not
  report its work (an older node), or whose global arrays are unknown, is aggregated with
  FedAvg, and the returned warning says so.
* ``fedavg-capped``: FedAvg with each node's data weight times min(1, τ_eff/work)
  (``fednova.capped_weights``), for every floating array: the new model is a weighted mean
  of the nodes' models, and extra work cannot pull it toward one node's optimum. Equal
  work, or a node that reported none, is FedAvg as above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from fl_client.settings import AGGREGATIONS
from strategies import fednova

#: Array names (their last part) that are state, not iterates of the optimiser: averaged
#: as FedAvg does under every setting.
NOT_ITERATES = ("running_mean", "running_var", "num_batches_tracked")


#: The aggregations of a synchronous round; ``fedbuff`` has none (``strategies.fedbuff``).
ROUND_AGGREGATIONS = tuple(a for a in AGGREGATIONS if a != "fedbuff")


def check_aggregation(mode: str) -> str:
    """``mode`` if it is one of ``ROUND_AGGREGATIONS``; else a ValueError naming the key."""
    allowed = ", ".join(ROUND_AGGREGATIONS)
    if mode in AGGREGATIONS and mode not in ROUND_AGGREGATIONS:
        raise ValueError(f"aggregation: {mode!r} has no rounds to aggregate; a round's: {allowed}")
    if mode not in ROUND_AGGREGATIONS:
        raise ValueError(f"aggregation: unknown value {mode!r}; allowed: {allowed}")
    return mode


def _metric(content: RecordDict, key: str) -> float | None:
    metrics = next(iter(content.metric_records.values()), None)
    if metrics is None or key not in metrics:
        return None
    value = float(metrics[key])  # type: ignore[arg-type]
    return value if math.isfinite(value) else None


def node_work(content: RecordDict) -> float | None:
    """A reply's local work (``fednova.work`` of its ``local-steps`` and ``local-lr``);
    None when it reports no positive work."""
    steps, lr = _metric(content, "local-steps"), _metric(content, "local-lr")
    if steps is None or lr is None or steps <= 0 or lr <= 0:
        return None
    return fednova.work(steps, lr)


def _arrays(content: RecordDict) -> ArrayRecord:
    return next(iter(content.array_records.values()))


def is_iterate(name: str, value: np.ndarray) -> bool:
    """Whether array ``name`` is moved by the optimiser's steps (FedNova normalises it)."""
    return np.issubdtype(value.dtype, np.floating) and name.rsplit(".", 1)[-1] not in NOT_ITERATES


def aggregate_round(
    mode: str,
    base: ArrayRecord | None,
    replies: Sequence[RecordDict],
    weight_key: str,
    server_round: int = 0,
) -> tuple[ArrayRecord, str | None]:
    """The new global arrays from ``replies`` (each with one ArrayRecord and one
    MetricRecord), and a warning when ``fednova`` had to fall back to FedAvg.

    ``base`` is the global ArrayRecord the round sent; ``weight_key`` the metric that
    weighs each node (``num-examples``)."""
    check_aggregation(mode)
    if mode == "fedavg":
        return aggregate_arrayrecords(list(replies), weight_key), None
    works = [node_work(c) for c in replies]
    lacking = sum(w is None for w in works)
    if base is None or lacking:
        why = (
            f"{lacking} of {len(replies)} nodes reported no local-steps and local-lr"
            if lacking
            else "the round's global arrays are unknown"
        )
        warning = f"aggregation: {mode}: {why}; round {server_round} aggregated with FedAvg"
        return aggregate_arrayrecords(list(replies), weight_key), warning
    if len(set(works)) == 1:  # equal work: FedNova is FedAvg
        return aggregate_arrayrecords(list(replies), weight_key), None
    weights = [_metric(c, weight_key) or 0.0 for c in replies]
    if mode == "fedavg-capped":
        capped = fednova.capped_weights(weights, [w for w in works if w is not None])
        return _weighted_mean(replies, capped, weights), None
    names = list(base.keys())
    base_np = [base[k].numpy() for k in names]
    local = [[_arrays(c)[k].numpy() for k in names] for c in replies]
    iterate = [is_iterate(k, v) for k, v in zip(names, base_np, strict=True)]
    pick = [i for i, it in enumerate(iterate) if it]
    rest = [i for i, it in enumerate(iterate) if not it]
    new: dict[str, np.ndarray] = {}
    nova = fednova.fednova(
        [base_np[i] for i in pick],
        [[arrs[i] for i in pick] for arrs in local],
        weights,
        [w for w in works if w is not None],
    )
    avg = fednova.fedavg([[arrs[i] for i in rest] for arrs in local], weights) if rest else []
    for i, value in zip(pick, nova, strict=True):
        new[names[i]] = value
    for i, value in zip(rest, avg, strict=True):
        new[names[i]] = value
    return ArrayRecord({k: Array(np.asarray(new[k])) for k in names}), None


def _weighted_mean(
    replies: Sequence[RecordDict], weights: Sequence[float], data_weights: Sequence[float]
) -> ArrayRecord:
    """Each iterate array the ``weights``-mean of the replies' arrays; the rest (BatchNorm's
    statistics, integer arrays) their ``data_weights``-mean, as FedAvg."""
    local = [_arrays(c) for c in replies]
    names = list(local[0].keys())
    out: dict[str, Array] = {}
    for name in names:
        values = [[arrays[name].numpy()] for arrays in local]
        w = weights if is_iterate(name, values[0][0]) else data_weights
        out[name] = Array(np.asarray(fednova.fedavg(values, w)[0]))
    return ArrayRecord(out)
