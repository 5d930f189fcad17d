"""The figures of a federated study, from its saved records only: each run's headline
numbers (to the target, over all rounds, after round 1), their mean ± std over seeds per
method and per (scenario, variant), the paired values of two variants, the per-node means,
and the split of B1's time to target over ours into three factors.

Every time and energy is read from the runs' records as the recorder (``fl_server.results``)
wrote them, never accounted again here."""

from __future__ import annotations

from collections import Counter
from typing import Any

from simulations.experiments import report_kit as kit

Rec = dict[str, Any]


def _sum_or_none(a: float | None, b: float | None) -> float | None:
    return a + b if a is not None and b is not None else None


def _to_target(rec: Rec) -> dict[str, Any]:
    """The headline numbers of one run up to the round that reached the target."""
    s = rec["summary"]
    r2t = s.get("round-to-target")
    upto = [r for r in rec["rounds"] if r2t is not None and r["server-round"] <= r2t]
    b2t, i2t = s.get("fleet-busy-energy-to-target-j"), s.get("fleet-idle-energy-to-target-j")
    first = rec["rounds"][0]["round-time-s"] if rec["rounds"] else None
    return {
        "reached": r2t is not None,
        "round-to-target": r2t,
        "time-to-target-s": s.get("sim-time-to-target-s"),
        # the same rounds with profiling counted as free (the limit of cheaper profiling)
        "time-to-target-free-profiling-s": s.get("sim-time-to-target-free-profiling-s"),
        "energy-to-target-j": _sum_or_none(b2t, i2t),
        "busy-energy-to-target-j": b2t,
        "idle-energy-to-target-j": i2t,
        "saved-to-target-j": sum(r["predicted-energy-saved-j"] for r in upto) if upto else None,
        "misses-to-target": sum(r["deadline-misses"] for r in upto) if upto else None,
        # rounds 2…target: the part of the time to target after every node's first round
        # (first-round profiling excluded; measured, not extrapolated)
        "time-to-target-after-1-s": (
            s["sim-time-to-target-s"] - first if r2t and first is not None else None
        ),
    }


def _after_round_1(rec: Rec) -> dict[str, Any]:
    """Means over the rounds after the first (when every profiling node has profiled)."""
    later = [r for r in rec["rounds"] if r["server-round"] >= 2]

    def per_round(key: str) -> float | None:
        return sum(float(r[key]) for r in later) / len(later) if later else None

    steady_b, steady_i = per_round("round-busy-energy-j"), per_round("round-idle-energy-j")
    return {
        "round-time-after-1-s": per_round("round-time-s"),
        "energy-per-round-after-1-j": _sum_or_none(steady_b, steady_i),
        "busy-per-round-after-1-j": steady_b,
        "idle-per-round-after-1-j": steady_i,
        # by node role: the round's slowest node and the rest, idle waiting included
        "critical-per-round-after-1-j": _sum_or_none(
            per_round("critical-busy-energy-j"), per_round("critical-idle-energy-j")
        ),
        "slack-per-round-after-1-j": _sum_or_none(
            per_round("slack-busy-energy-j"), per_round("slack-idle-energy-j")
        ),
        "saved-per-round-after-1-j": per_round("predicted-energy-saved-j"),
    }


def cell_metrics(rec: Rec) -> dict[str, Any]:
    """The headline numbers of one run (to the target and over all rounds), read from its
    summary and rounds as the recorder wrote them."""
    s = rec["summary"]
    busy, idle = s.get("fleet-busy-energy-j"), s.get("fleet-idle-energy-j")
    return {
        **_to_target(rec),
        "rounds": len(rec["rounds"]),
        "final-accuracy": s.get("final-accuracy"),
        "sim-time-s": s.get("sim-time-s"),
        "energy-j": _sum_or_none(busy, idle),
        "busy-energy-j": busy,
        "idle-energy-j": idle,
        "energy-saved-j": s.get("fleet-predicted-energy-saved-j"),
        "deadline-misses": s.get("deadline-misses", 0),
        "drift-reprofiles": s.get("drift-reprofiles", 0),
        "profile-share": s.get("profile-share"),
        "node-rounds-failed": s.get("node-rounds-failed"),
        "over-cap-node-rounds": s.get("over-cap-node-rounds"),
        "time-over-cap-s": sum(float(n["time-over-cap-s"]) for n in s["nodes"].values()),
        "profile-energy-j": s.get("fleet-profile-energy-j"),
        **_after_round_1(rec),
    }


QUANTS = (
    "round-to-target",
    "time-to-target-s",
    "time-to-target-free-profiling-s",
    "energy-to-target-j",
    "busy-energy-to-target-j",
    "idle-energy-to-target-j",
    "saved-to-target-j",
    "misses-to-target",
    "final-accuracy",
    "sim-time-s",
    "energy-j",
    "busy-energy-j",
    "idle-energy-j",
    "energy-saved-j",
    "deadline-misses",
    "drift-reprofiles",
    "profile-share",
    "node-rounds-failed",
    "over-cap-node-rounds",
    "time-over-cap-s",
    "profile-energy-j",
    "round-time-after-1-s",
    "energy-per-round-after-1-j",
    "busy-per-round-after-1-j",
    "idle-per-round-after-1-j",
    "critical-per-round-after-1-j",
    "slack-per-round-after-1-j",
    "saved-per-round-after-1-j",
    "time-to-target-after-1-s",
)


def _group(recs: list[Rec]) -> dict[str, Any]:
    ms = [cell_metrics(r) for r in recs]
    g: dict[str, Any] = {
        "seeds": len(ms),
        "seeds-reached": sum(1 for m in ms if m["reached"]),
        "per-seed": {int(r["seed"]): m for r, m in zip(recs, ms, strict=True)},
    }
    for q in QUANTS:
        g[f"{q}-mean"], g[f"{q}-std"] = kit.mean_std([m[q] for m in ms])
    return g


def aggregate(records: list[Rec]) -> dict[str, Any]:
    """Mean ± std over seeds per method and per (scenario, variant)."""
    groups: dict[tuple[str, str], list[Rec]] = {}
    for rec in records:
        for scenario, variant in rec["uses"]:
            groups.setdefault((scenario, variant), []).append(rec)
    out: dict[str, Any] = {"methods": {}, "scenarios": {}}
    for (scenario, variant), recs in sorted(groups.items()):
        recs = sorted(recs, key=lambda r: r["seed"])
        if scenario == "methods":
            out["methods"][variant] = _group(recs)
        else:
            out["scenarios"].setdefault(scenario, {})[variant] = _group(recs)
    return out


def paired(
    summary: dict[str, Any], scenario: str, ref: str, other: str, q: str
) -> list[tuple[int, float, float]]:
    """(seed, reference value, other value) for seeds where both have ``q``."""
    sc = summary["scenarios"].get(scenario, {})
    a, b = sc.get(ref, {}).get("per-seed", {}), sc.get(other, {}).get("per-seed", {})
    return [
        (seed, a[seed][q], b[seed][q])
        for seed in sorted(set(a) & set(b))
        if a[seed][q] is not None and b[seed][q] is not None
    ]


#: Per-node totals of the recorder averaged over seeds in the node tables.
NODE_MEANS = (
    "train-time-s",
    "profile-time-s",
    "energy-j",
    "wait-s",
    "idle-energy-j",
    "slowest-share",
    "slowest-time-share",
    "mean-wait-s",
    "over-cap-rounds",
    "violation-rounds",
    "time-over-cap-s",
    "drift-reprofiles",
    "rounds",
    "rounds-ok",
)


def mean_nodes(recs: list[Rec]) -> dict[str, dict[str, Any]]:
    """Per node, the mean over seeds of its totals in the runs' summaries (choices and caps
    pooled, the highest peak)."""
    per: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        for name, t in r["summary"]["nodes"].items():
            energy = {"energy-j": t["train-energy-j"] + t["profile-energy-j"]}
            per.setdefault(name, []).append({**t, **energy})
    out: dict[str, dict[str, Any]] = {}
    for name, ts in per.items():
        agg: dict[str, Any] = {
            "device": ts[0]["device"],
            "caps": [c for t in ts for c in t["caps"]],
            "choices": sum((Counter(t["choices"]) for t in ts), Counter()),
            "peak-power-w": max(t["peak-power-w"] for t in ts),
        }
        for q in NODE_MEANS:
            agg[q] = kit.mean_std([t[q] for t in ts])[0]
        out[name] = agg
    return out


def node_names(records: list[Rec]) -> list[str]:
    seen: dict[str, None] = {}
    for r in records:
        for name in r["summary"]["nodes"]:
            seen.setdefault(name, None)
    return list(seen)


def by_use(records: list[Rec], scenario: str, variant: str) -> list[Rec]:
    return sorted((r for r in records if [scenario, variant] in r["uses"]), key=lambda r: r["seed"])


def time_factors(ours: dict[str, Any], b1: dict[str, Any]) -> dict[str, float] | None:
    """B1's time to target ÷ ours, split exactly into three factors of one seed's runs:

    ``rounds`` = B1's rounds ÷ ours (the batch size's effect on learning), ``per-round`` =
    B1's mean round time ÷ ours with profiling counted as free (the (b, f) choice's speed;
    in a synchronous round only the slowest node counts), ``profiling`` = ours with free
    profiling ÷ ours as run (≤ 1: what profiling costs). Their product is the ratio.
    None when either run missed the target.
    """
    t_o, t_b = ours["time-to-target-s"], b1["time-to-target-s"]
    free_o, r_o, r_b = (
        ours["time-to-target-free-profiling-s"],
        ours["round-to-target"],
        b1["round-to-target"],
    )
    if None in (t_o, t_b, free_o, r_o, r_b) or not (t_o and free_o and r_o and r_b):
        return None
    return {
        "ratio": t_b / t_o,
        "rounds": r_b / r_o,
        "per-round": (t_b / r_b) / (free_o / r_o),
        "profiling": free_o / t_o,
    }
