"""A round's aggregation of the nodes' arrays, by the run setting ``aggregation``.

* ``fedavg``: the weighted mean (``strategies.weighted_mean``, Flower's FedAvg float for
  float), weighted by each reply's ``num-examples``; what every run did before this
  setting.
* ``fednova``: FedNova's normalised averaging (``strategies.fednova``) of the arrays the
  local optimiser moves, with each node's work from its reply (``local-steps`` ×
  ``local-lr``: Adam, whose bias-corrected first moment sums its gradient weights to the
  step count, see ``strategies.fednova``); the rest (BatchNorm's running statistics and
  step counter, integer arrays) averaged as FedAvg does. A round whose nodes did equal
  work is FedAvg exactly (the same floats). A round in which a node did not
  report its work (an older node), or whose global arrays are unknown, is aggregated with
  FedAvg, and the returned warning says so.
* ``fedavg-capped``: FedAvg with each node's data weight times min(1, τ_eff/work)
  (``fednova.capped_weights``), for every floating array: the new model is a weighted mean
  of the nodes' models, and extra work cannot pull it toward one node's optimum. Equal
  work, or a node that reported none, is FedAvg as above.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from fl_client.settings import AGGREGATIONS
from strategies import fednova
from strategies.weighted_mean import weighted_mean

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


def _metrics(content: RecordDict) -> Mapping[str, Any]:
    """A reply's MetricRecord (its first; empty when it has none)."""
    return next(iter(content.metric_records.values()), {})


def _metric(content: RecordDict, key: str) -> float | None:
    metrics = _metrics(content)
    if key not in metrics:
        return None
    value = float(metrics[key])
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
    weighs each node (``num-examples``). Every mean is ``weighted_mean``'s."""
    check_aggregation(mode)
    weights = [float(_metrics(c)[weight_key]) for c in replies]
    if mode == "fedavg":
        return _mean(replies, weights), None
    works = [node_work(c) for c in replies]
    lacking = sum(w is None for w in works)
    if base is None or lacking:
        why = (
            f"{lacking} of {len(replies)} nodes reported no local-steps and local-lr"
            if lacking
            else "the round's global arrays are unknown"
        )
        warning = f"aggregation: {mode}: {why}; round {server_round} aggregated with FedAvg"
        return _mean(replies, weights), warning
    if len(set(works)) == 1:  # equal work: FedNova is FedAvg
        return _mean(replies, weights), None
    done = [w for w in works if w is not None]
    if mode == "fedavg-capped":
        return _mean(replies, weights, iterates=fednova.capped_weights(weights, done)), None
    names = [k for k in base if is_iterate(k, base[k].numpy())]
    moved = fednova.fednova(
        [base[k].numpy() for k in names],
        [[_arrays(c)[k].numpy() for k in names] for c in replies],
        weights,
        done,
    )
    return _mean(replies, weights, normalised=dict(zip(names, moved, strict=True))), None


def _mean(
    replies: Sequence[RecordDict],
    weights: Sequence[float],
    *,
    iterates: Sequence[float] | None = None,
    normalised: Mapping[str, np.ndarray] | None = None,
) -> ArrayRecord:
    """The replies' arrays, name by name, in the first reply's order: the ``normalised``
    array where given (FedNova's), else the ``weighted_mean`` by ``weights``, or by
    ``iterates`` for an iterate (``is_iterate``) when given."""
    local = [_arrays(c) for c in replies]
    names = list(local[0].keys())
    for arrays in local[1:]:
        if set(arrays.keys()) != set(names):
            raise ValueError(f"aggregation: the replies' arrays differ: {names} and {list(arrays)}")
    out: dict[str, Array] = {}
    for name in names:
        if normalised is not None and name in normalised:
            out[name] = Array(np.asarray(normalised[name]))
            continue
        values = [arrays[name].numpy() for arrays in local]
        w = iterates if iterates is not None and is_iterate(name, values[0]) else weights
        out[name] = Array(weighted_mean(values, w))
    return ArrayRecord(out)
