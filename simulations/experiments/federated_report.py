"""Tables, plots and report.md of a federated study, from its saved records only.

``powerfl experiment report DIR`` re-renders everything here without running anything.
Definitions (all device time and energy from the digital twins):

* *time to target*: simulated wall-clock time (sum of round times; a synchronous round lasts
  as long as its slowest node, profiling included) until the global model's accuracy first
  reaches ``target-accuracy``;
* *fleet energy to target*: training + profiling energy of every node up to that round;
  *idle waiting energy*: each node's idle power × the time it waits for the slowest node,
  reported separately and summed with the former;
* *straggler share*: the share of rounds in which a node was the slowest (it set the round
  time) and the share of the simulated time those rounds took; *wait*: round time − the
  node's own time, per round.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulations.experiments.config import METHOD_LABELS, STUDY_METHODS
from simulations.experiments.federated import SCENARIO_VARIANTS, SCENARIOS
from simulations.experiments.records import load_all, write_json

SCENARIO_TITLES = {
    "pacing": "Deadline-aware pacing: off vs deadline",
    "varying-cap": "Caps that change over time: schedule vs fixed at the schedule's minimum",
    "drift": "LUT drift: drift check vs none",
}


class FederatedReportError(ValueError):
    """The folder is not a federated study output."""


def _mean_std(xs: Sequence[float | None]) -> tuple[float | None, float | None]:
    vals = [float(x) for x in xs if x is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def _fmt(m: float | None, s: float | None = None, digits: int | None = None) -> str:
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return "—"
    if digits is None:
        mag = math.floor(math.log10(abs(m))) if m else 0
        digits = max(0, 2 - mag)
    if s is None:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def _cap(x: Any) -> float:
    if x in ("inf", "Infinity", None):
        return math.inf
    return float(x)


def _cap_text(caps: set[float]) -> str:
    if not caps:
        return "?"
    lo, hi = min(caps), max(caps)
    one = "none" if math.isinf(lo) else f"{lo:g}"
    if lo == hi:
        return one if one == "none" else f"{one} W"
    two = "none" if math.isinf(hi) else f"{hi:g} W"
    return f"{one}–{two}"


# --------------------------------------------------------------------------- per record


def node_breakdown(rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per node over every round of the run: times, energies, waits, straggler share."""
    by_round: dict[int, list[dict[str, Any]]] = {}
    for n in rec["nodes"]:
        by_round.setdefault(int(n["server-round"]), []).append(n)
    out: dict[str, dict[str, Any]] = {}
    total_time = 0.0
    for rnd in sorted(by_round):
        rows = by_round[rnd]
        ok = [n for n in rows if n.get("ok")]
        times = {n["node-name"]: n["train-time-s"] + n["profile-time-s"] for n in ok}
        round_time = max(times.values(), default=0.0)
        total_time += round_time
        slowest = max(times, key=lambda k: times[k]) if times else None
        for n in rows:
            t = out.setdefault(
                n["node-name"],
                {
                    "device": n.get("device"),
                    "rounds": 0,
                    "rounds-ok": 0,
                    "train-time-s": 0.0,
                    "profile-time-s": 0.0,
                    "energy-j": 0.0,
                    "wait-s": 0.0,
                    "wait-energy-j": 0.0,
                    "slowest-rounds": 0,
                    "slowest-time-s": 0.0,
                    "over-cap-rounds": 0,
                    "violation-rounds": 0,
                    "peak-max-w": 0.0,
                    "time-over-cap-s": 0.0,
                    "reprofiles": 0,
                    "caps": set(),
                    "choices": Counter(),
                    "errors": Counter(),
                },
            )
            t["rounds"] += 1
            if not n.get("ok"):
                t["errors"][str(n.get("error", ""))[:120]] += 1
                continue
            own = times[n["node-name"]]
            wait = round_time - own
            t["rounds-ok"] += 1
            t["train-time-s"] += n["train-time-s"]
            t["profile-time-s"] += n["profile-time-s"]
            t["energy-j"] += n["energy-j"] + n.get("profile-energy-j", 0.0)
            t["wait-s"] += wait
            idle = n.get("idle-power-w")
            if idle is not None and math.isfinite(float(idle)):
                t["wait-energy-j"] += float(idle) * wait
            cap = _cap(n.get("p-max-w"))
            t["caps"].add(cap)
            if n.get("peak-power-w", 0.0) > cap:
                t["over-cap-rounds"] += 1
            if float(n.get("cap-violations", 0.0) or 0.0) > 0:
                t["violation-rounds"] += 1
            t["peak-max-w"] = max(t["peak-max-w"], float(n.get("peak-power-w", 0.0)))
            t["time-over-cap-s"] += float(n.get("time-over-cap-s", 0.0) or 0.0)
            t["reprofiles"] += int(n.get("drift-reprofiled", 0.0) or 0)
            t["choices"][f"b{int(n['batch-size'])}@{float(n['gpu-freq-mhz']):g}"] += 1
            if n["node-name"] == slowest:
                t["slowest-rounds"] += 1
                t["slowest-time-s"] += round_time
    for t in out.values():
        t["slowest-share"] = t["slowest-rounds"] / t["rounds"] if t["rounds"] else 0.0
        t["slowest-time-share"] = t["slowest-time-s"] / total_time if total_time else 0.0
        t["mean-wait-s"] = t["wait-s"] / t["rounds-ok"] if t["rounds-ok"] else None
    return out


def cell_metrics(rec: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of one run (to the target and over all rounds)."""
    s = rec["summary"]
    rounds = rec["rounds"]
    r2t = s.get("round-to-target")
    upto = [r for r in rounds if r2t is not None and r["server_round"] <= r2t]
    e2t = s.get("fleet-energy-to-target-j")
    w2t = s.get("fleet-wait-energy-to-target-j")
    nodes = node_breakdown(rec)
    later = [r for r in rounds if r["server_round"] >= 2]

    def per_round(key: str) -> float | None:
        return sum(float(r[key]) for r in later) / len(later) if later else None

    def saved_j(r: dict[str, Any]) -> float:
        # pacing's LUT-predicted saving (records before the rename call it energy_saved_j)
        return float(r.get("predicted_energy_saved_j", r.get("energy_saved_j", 0.0)))

    steady_e, steady_w = per_round("round_energy_j"), per_round("round_wait_energy_j")
    return {
        "reached": r2t is not None,
        "round-to-target": r2t,
        "time-to-target-s": s.get("sim-time-to-target-s"),
        "energy-to-target-j": e2t,
        "wait-energy-to-target-j": w2t,
        "total-energy-to-target-j": (e2t + w2t) if e2t is not None and w2t is not None else None,
        "saved-to-target-j": sum(saved_j(r) for r in upto) if upto else None,
        "misses-to-target": sum(r.get("deadline_misses", 0) for r in upto) if upto else None,
        "rounds": len(rounds),
        "final-accuracy": s.get("final-accuracy"),
        "sim-time-s": s.get("sim-time-s"),
        "energy-j": s.get("fleet-energy-j"),
        "wait-energy-j": s.get("fleet-wait-energy-j"),
        "total-energy-j": (s.get("fleet-energy-j") or 0.0) + (s.get("fleet-wait-energy-j") or 0.0),
        "energy-saved-j": s.get(
            "fleet-predicted-energy-saved-j", s.get("fleet-energy-saved-j", 0.0)
        ),
        "deadline-misses": s.get("deadline-misses", 0),
        "drift-reprofiles": s.get("drift-reprofiles", 0),
        "profile-share": s.get("profile-share"),
        "node-rounds-failed": sum(r.get("nodes_failed", 0) for r in rounds),
        "over-cap-node-rounds": sum(t["over-cap-rounds"] for t in nodes.values()),
        "profile-energy-j": sum(float(n.get("profile-energy-j", 0.0)) for n in rec["nodes"]),
        "round-time-after-1-s": per_round("round_time_s"),
        "energy-per-round-after-1-j": steady_e,
        "wait-per-round-after-1-j": steady_w,
        "sum-per-round-after-1-j": (
            steady_e + steady_w if steady_e is not None and steady_w is not None else None
        ),
        "saved-per-round-after-1-j": (
            sum(saved_j(r) for r in later) / len(later) if later else None
        ),
        # rounds 2…target: the part of the time to target after every node's first round
        # (first-round profiling excluded; measured, not extrapolated)
        "time-to-target-after-1-s": (
            s["sim-time-to-target-s"] - rounds[0]["round_time_s"] if r2t and rounds else None
        ),
        "time-over-cap-s": sum(t["time-over-cap-s"] for t in nodes.values()),
    }


QUANTS = (
    "round-to-target",
    "time-to-target-s",
    "energy-to-target-j",
    "wait-energy-to-target-j",
    "total-energy-to-target-j",
    "saved-to-target-j",
    "misses-to-target",
    "final-accuracy",
    "sim-time-s",
    "energy-j",
    "wait-energy-j",
    "total-energy-j",
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
    "wait-per-round-after-1-j",
    "sum-per-round-after-1-j",
    "saved-per-round-after-1-j",
    "time-to-target-after-1-s",
)


def _group(recs: list[dict[str, Any]]) -> dict[str, Any]:
    ms = [cell_metrics(r) for r in recs]
    g: dict[str, Any] = {
        "seeds": len(ms),
        "seeds-reached": sum(1 for m in ms if m["reached"]),
        "per-seed": {int(r["seed"]): m for r, m in zip(recs, ms, strict=True)},
    }
    for q in QUANTS:
        g[f"{q}-mean"], g[f"{q}-std"] = _mean_std([m[q] for m in ms])
    return g


def aggregate(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± std over seeds per method and per (scenario, variant)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
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


def _paired(
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


# --------------------------------------------------------------------------- plots


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def _curve(rec: dict[str, Any]) -> list[tuple[int, float, float, float, float]]:
    """(round, sim time s, accuracy, fleet energy J, fleet wait energy J), round 0 first."""
    s = rec["summary"]
    pts = [(0, 0.0, float(s.get("initial-accuracy") or 0.0), 0.0, 0.0)]
    for r in rec["rounds"]:
        pts.append(
            (
                int(r["server_round"]),
                float(r["sim_time_s"]),
                float(r["accuracy"]),
                float(r["fleet_energy_j"]),
                float(r["fleet_wait_energy_j"]),
            )
        )
    return pts


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fig_accuracy(
    out: Path, series: list[tuple[str, dict[str, Any]]], name: str, title: str, target: float
) -> str:
    plt = _plt()
    _write_csv(
        out / f"{name}.csv",
        ["series", "seed", "round", "sim_time_s", "accuracy", "fleet_energy_j", "wait_energy_j"],
        [[label, rec["seed"], *pt] for label, rec in series for pt in _curve(rec)],
    )
    fig, ax = plt.subplots(figsize=(7, 4))
    colors: dict[str, Any] = {}
    for label, rec in series:
        pts = _curve(rec)
        kw: dict[str, Any] = {"color": colors[label]} if label in colors else {"label": label}
        (line,) = ax.plot([p[1] for p in pts], [p[2] for p in pts], marker=".", lw=1.2, **kw)
        colors.setdefault(label, line.get_color())
    ax.axhline(target, color="grey", ls="--", lw=0.8, label=f"target {target:g}")
    ax.set_xlabel("simulated wall-clock time (s, device time of the slowest node per round)")
    ax.set_ylabel("global test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)
    return name


def _fig_energy(out: Path, summary: dict[str, Any], methods: list[str]) -> str:
    plt = _plt()
    name = "fig-energy-to-target"
    rows = []
    for m in methods:
        g = summary["methods"][m]
        rows.append(
            [
                m,
                g["seeds-reached"],
                g["seeds"],
                g["energy-to-target-j-mean"],
                g["energy-to-target-j-std"],
                g["wait-energy-to-target-j-mean"],
                g["wait-energy-to-target-j-std"],
                g["energy-j-mean"],
                g["wait-energy-j-mean"],
            ]
        )
    _write_csv(
        out / f"{name}.csv",
        [
            "method",
            "seeds_reached",
            "seeds",
            "train_profile_energy_to_target_j_mean",
            "train_profile_energy_to_target_j_std",
            "wait_energy_to_target_j_mean",
            "wait_energy_to_target_j_std",
            "train_profile_energy_all_rounds_j_mean",
            "wait_energy_all_rounds_j_mean",
        ],
        rows,
    )
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = [METHOD_LABELS.get(m, m) for m in methods]
    for ax, (a, b, title) in zip(
        axes,
        (
            (3, 5, "to the target accuracy (seeds that reached it)"),
            (7, 8, "whole run (stops at the target)"),
        ),
        strict=True,
    ):
        tp = [r[a] or 0.0 for r in rows]
        wt = [r[b] or 0.0 for r in rows]
        ax.bar(labels, tp, label="training + profiling")
        ax.bar(labels, wt, bottom=tp, label="idle waiting")
        ax.set_ylabel("fleet energy (J)")
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="x", labelsize=7)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)
    return name


# --------------------------------------------------------------------------- report.md


def load_output(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    manifest_path = out / "manifest.json"
    if not manifest_path.is_file():
        raise FederatedReportError(
            f"{out}: no manifest.json; expected the output folder of `powerfl experiment run`"
        )
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    records = [r for r in load_all(out / "records" / "cells") if r.get("study") == "federated"]
    return manifest, records


def _by_use(records: list[dict[str, Any]], scenario: str, variant: str) -> list[dict[str, Any]]:
    return sorted((r for r in records if [scenario, variant] in r["uses"]), key=lambda r: r["seed"])


def render(out: Path) -> Path:
    """Write summary.json, plots (PNG + CSV) and report.md into ``out``; return report.md."""
    manifest, records = load_output(out)
    config = manifest["config"]
    summary = aggregate(records)
    write_json(
        out / "summary.json",
        {
            "methods": {
                m: {k: v for k, v in g.items() if k != "per-seed"}
                for m, g in summary["methods"].items()
            },
            "scenarios": {
                s: {v: {k: x for k, x in g.items() if k != "per-seed"} for v, g in sc.items()}
                for s, sc in summary["scenarios"].items()
            },
            "per-seed": {
                "methods": {m: g["per-seed"] for m, g in summary["methods"].items()},
                "scenarios": {
                    s: {v: g["per-seed"] for v, g in sc.items()}
                    for s, sc in summary["scenarios"].items()
                },
            },
        },
    )
    methods = [m for m in STUDY_METHODS if m in summary["methods"]]
    target = float(config["target-accuracy"])
    figures: list[tuple[str, str]] = []
    if methods:
        series = [
            (METHOD_LABELS.get(m, m), rec)
            for m in methods
            for rec in _by_use(records, "methods", m)
        ]
        figures.append(
            (
                _fig_accuracy(
                    out,
                    series,
                    "fig-accuracy-vs-time",
                    "Accuracy against simulated time per method (one line per seed)",
                    target,
                ),
                "accuracy against simulated time per method",
            )
        )
        figures.append((_fig_energy(out, summary, methods), "fleet energy per method"))
    for scenario in SCENARIOS:
        if scenario not in summary["scenarios"]:
            continue
        series = [
            (f"{scenario}: {v}", rec)
            for v in SCENARIO_VARIANTS[scenario]
            for rec in _by_use(records, scenario, v)
        ]
        figures.append(
            (
                _fig_accuracy(out, series, f"fig-{scenario}", SCENARIO_TITLES[scenario], target),
                SCENARIO_TITLES[scenario],
            )
        )

    lines: list[str] = []
    add = lines.append
    add(f"# Experiment `{config['name']}` — federated study ({config['scale']} scale)")
    add("")
    if config.get("description"):
        add(config["description"])
        add("")
    counts = manifest.get("counts", {})
    status = "complete" if manifest.get("complete") else "INCOMPLETE (some cells missing)"
    add(f"Status: {status}; {len(records)} run records. Command:")
    add("")
    add("```")
    add(manifest.get("command", "?"))
    add("```")
    add("")
    wall = manifest.get("wall-s")
    add(
        f"Wall time of the last `run`: {_fmt(wall, digits=0)} s on "
        f"{manifest.get('host', {}).get('cpus', '?')} CPU core(s) "
        f"(cells run {counts.get('cells-done', '?')}, reused {counts.get('cells-reused', '?')}, "
        f"failed {counts.get('cells-failed', '?')}); host wall time per run: "
        + ", ".join(
            f"{r['method']}/seed {r['seed']} {r['host-wall-s']:.0f} s"
            for r in sorted(records, key=lambda r: (r["seed"], r["method"]))
        )
        + "."
    )
    add("")
    for f in counts.get("failures", []):
        add(f"- failed: {f}")
    if counts.get("failures"):
        add("")
    add(
        f"Each run: fleet `{config['fleet']}` in Flower's simulation engine, model "
        f"`{config['model']}`, {config['partitioning']} partitioning"
        + (
            f" (Dirichlet α = {config['dirichlet-alpha']:g})"
            if config["partitioning"] == "dirichlet"
            else ""
        )
        + f", {config['num-rounds']} rounds, {config['local-epochs']} local epochs per round, "
        f"target accuracy {target:g} on the server's test split, seeds "
        f"{', '.join(str(s) for s in range(int(config['seeds'])))} (the same data split and "
        "initial weights for every method of a seed). Time is simulated device time: a round "
        "lasts as long as its slowest node (training + profiling); energy is the twins' "
        "sensor energy. Mean ± std over seeds; a quantity 'to target' is averaged over the "
        "seeds that reached the target (shown as reached/seeds)."
    )
    add("")
    if methods:
        _methods_section(add, summary, methods, records, config)
    for scenario in SCENARIOS:
        if scenario in summary["scenarios"]:
            _scenario_section(add, summary, scenario, records, config)
    add("## Plots")
    add("")
    for name, kind in figures:
        add(f"- {kind}: `{name}.png` (data: `{name}.csv`)")
        add("")
        add(f"  ![{name}]({name}.png)")
        add("")
    add("## Settings (resolved from the experiment file at this scale)")
    add("")
    add("| key | value |")
    add("|---|---|")
    for k, v in config.items():
        add(f"| `{k}` | `{json.dumps(v)}` |")
    add("")
    add(
        "Run settings of every cell (the `-c key=value` overrides of `[tool.flwr.app.config]`) "
        "are in each record under `records/cells/` (`settings`), with the full per-round and "
        "per-node rows of its run; each run's log is under `runs/`."
    )
    add("")
    if manifest.get("data-note"):
        add(manifest["data-note"])
        add("")
    add(
        "Experiment file: `" + manifest.get("experiment-file", "?") + "` (copied to "
        "`experiment.toml` in this folder)."
    )
    add("")
    add("## Software")
    add("")
    for k, v in manifest.get("versions", {}).items():
        add(f"- {k} {v}")
    add("")
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _reached(g: dict[str, Any], q: str, digits: int | None = None) -> str:
    if g["seeds-reached"] == 0:
        return "not reached"
    txt = _fmt(g[f"{q}-mean"], g[f"{q}-std"], digits)
    if g["seeds-reached"] < g["seeds"]:
        txt += f" ({g['seeds-reached']}/{g['seeds']})"
    return txt


def _methods_section(
    add: Any,
    summary: dict[str, Any],
    methods: list[str],
    records: list[dict[str, Any]],
    config: dict[str, Any],
) -> None:
    ms = summary["methods"]
    add("## Methods on the same fleet, data and seeds")
    add("")
    add("**To the target accuracy** (energy: training + profiling | idle waiting | sum)")
    add("")
    add(
        "| method | reached | rounds | sim time s | energy J | idle wait J | sum J | "
        "profiling share | time ÷ ours | sum energy ÷ ours | rounds 2…target s | "
        "round time after round 1 s |"
    )
    add("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ours = ms.get("power-aware")
    for m in methods:
        g = ms[m]

        def ratio(q: str, g: dict[str, Any] = g) -> str:
            if ours is None or not ours[f"{q}-mean"] or g[f"{q}-mean"] is None:
                return "—"
            return f"{g[f'{q}-mean'] / ours[f'{q}-mean']:.2f}×"

        add(
            f"| {METHOD_LABELS.get(m, m)} | {g['seeds-reached']}/{g['seeds']} | "
            f"{_reached(g, 'round-to-target', 1)} | {_reached(g, 'time-to-target-s')} | "
            f"{_reached(g, 'energy-to-target-j')} | {_reached(g, 'wait-energy-to-target-j')} | "
            f"{_reached(g, 'total-energy-to-target-j')} | "
            f"{_fmt(100 * (g['profile-share-mean'] or 0.0), digits=1)}% | "
            f"{ratio('time-to-target-s')} | {ratio('total-energy-to-target-j')} | "
            f"{_reached(g, 'time-to-target-after-1-s')} | "
            f"{_fmt(g['round-time-after-1-s-mean'], g['round-time-after-1-s-std'])} |"
        )
    add("")
    add(
        "Ratios are of the means over the seeds that reached the target (> 1× means ours "
        "is faster / uses less). Profiling share = profiling ÷ (profiling + training) device "
        "time summed over nodes and all rounds. *Rounds 2…target*: the time to target "
        "without the first round, in which every profiling node profiles (the one-time cost "
        "that a longer training amortises); *round time after round 1*: mean over the later "
        "rounds."
    )
    add("")
    add(
        f"**Whole run** (a run stops at the round that reaches the target, else after "
        f"{config['num-rounds']} rounds)"
    )
    add("")
    add(
        "| method | final accuracy | sim time s | energy J | idle wait J | sum J | "
        "node-rounds over cap | node-rounds failed |"
    )
    add("|---|---|---|---|---|---|---|---|")
    for m in methods:
        g = ms[m]
        add(
            f"| {METHOD_LABELS.get(m, m)} | "
            f"{_fmt(g['final-accuracy-mean'], g['final-accuracy-std'], 3)} | "
            f"{_fmt(g['sim-time-s-mean'], g['sim-time-s-std'])} | "
            f"{_fmt(g['energy-j-mean'], g['energy-j-std'])} | "
            f"{_fmt(g['wait-energy-j-mean'], g['wait-energy-j-std'])} | "
            f"{_fmt(g['total-energy-j-mean'], g['total-energy-j-std'])} | "
            f"{_fmt(g['over-cap-node-rounds-mean'], digits=1)} | "
            f"{_fmt(g['node-rounds-failed-mean'], digits=1)} |"
        )
    add("")
    add(
        "A node-round is *over cap* when a sample of the twin's power sensor during local "
        "training exceeded the node's cap (sensor noise included; *time over cap* is how long "
        "the samples stayed above it); *failed* when the node returned no update (reasons "
        "below)."
    )
    add("")
    add("### Straggler share (whole run, mean over seeds)")
    add("")
    add(
        "Per node: % of rounds it was the slowest (set the round time) / % of simulated "
        "time those rounds took / mean wait for the slowest node per round (s)."
    )
    add("")
    names = _node_names([r for m in methods for r in _by_use(records, "methods", m)])
    add("| node | device | " + " | ".join(METHOD_LABELS.get(m, m) for m in methods) + " |")
    add("|---|---|" + "---|" * len(methods))
    tables = {m: _mean_nodes(_by_use(records, "methods", m)) for m in methods}
    for name in names:
        dev = next((t[name]["device"] for t in tables.values() if name in t), "?")
        cells = []
        for m in methods:
            t = tables[m].get(name)
            cells.append(
                "—"
                if t is None
                else f"{100 * t['slowest-share']:.0f}% / {100 * t['slowest-time-share']:.0f}% / "
                f"{_fmt(t['mean-wait-s'])}"
            )
        add(f"| {name} | {dev} | " + " | ".join(cells) + " |")
    add("")
    add("### Per-device time and energy breakdown (whole run, mean over seeds)")
    add("")
    for m in methods:
        add(f"**{METHOD_LABELS.get(m, m)}**")
        add("")
        _node_table(add, tables[m], names)
    errors = sorted(
        {
            f"{r['method']} seed {r['seed']}: {n['node-name']} round {n['server-round']}: "
            f"{str(n.get('error', ''))[:200]}"
            for m in methods
            for r in _by_use(records, "methods", m)
            for n in r["nodes"]
            if not n.get("ok")
        }
    )
    if errors:
        add("Node-rounds without an update:")
        add("")
        for e in errors[:30]:
            add(f"- {e}")
        if len(errors) > 30:
            add(f"- … and {len(errors) - 30} more (see the records)")
        add("")


def _node_names(records: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for r in records:
        for n in r["nodes"]:
            seen.setdefault(n["node-name"], None)
    return list(seen)


def _mean_nodes(recs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per node, the mean over seeds of ``node_breakdown`` (choices and caps pooled)."""
    per: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        for name, t in node_breakdown(r).items():
            per.setdefault(name, []).append(t)
    out: dict[str, dict[str, Any]] = {}
    for name, ts in per.items():
        agg: dict[str, Any] = {
            "device": ts[0]["device"],
            "caps": set(),
            "choices": Counter(),
            "peak-max-w": max(t["peak-max-w"] for t in ts),
        }
        for t in ts:
            agg["caps"] |= t["caps"]
            agg["choices"].update(t["choices"])
        for q in (
            "train-time-s",
            "profile-time-s",
            "energy-j",
            "wait-s",
            "wait-energy-j",
            "slowest-share",
            "slowest-time-share",
            "mean-wait-s",
            "over-cap-rounds",
            "violation-rounds",
            "time-over-cap-s",
            "reprofiles",
            "rounds",
            "rounds-ok",
        ):
            agg[q] = _mean_std([t[q] for t in ts])[0]
        out[name] = agg
    return out


def _node_table(add: Any, table: dict[str, dict[str, Any]], names: list[str]) -> None:
    add(
        "| node | device | cap | (b, f MHz) × rounds | train s | profile s | energy J | "
        "wait s | idle wait J | slowest | peak max W | rounds peak > cap | time over cap s | "
        "rounds ok |"
    )
    add("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        t = table.get(name)
        if t is None:
            continue
        choices = ", ".join(f"{k} ×{v}" for k, v in t["choices"].most_common(3))
        if len(t["choices"]) > 3:
            choices += ", …"
        add(
            f"| {name} | {t['device']} | {_cap_text(t['caps'])} | {choices or '—'} | "
            f"{_fmt(t['train-time-s'])} | {_fmt(t['profile-time-s'])} | {_fmt(t['energy-j'])} | "
            f"{_fmt(t['wait-s'])} | {_fmt(t['wait-energy-j'])} | "
            f"{100 * (t['slowest-share'] or 0.0):.0f}% | {t['peak-max-w']:.2f} | "
            f"{_fmt(t['over-cap-rounds'], digits=1)} | {_fmt(t['time-over-cap-s'])} | "
            f"{_fmt(t['rounds-ok'], digits=1)}/{_fmt(t['rounds'], digits=1)} |"
        )
    add("")


def _scenario_section(
    add: Any,
    summary: dict[str, Any],
    scenario: str,
    records: list[dict[str, Any]],
    config: dict[str, Any],
) -> None:
    sc = summary["scenarios"][scenario]
    variants = [v for v in SCENARIO_VARIANTS[scenario] if v in sc]
    ref, other = SCENARIO_VARIANTS[scenario]
    add(f"## {SCENARIO_TITLES[scenario]}")
    add("")
    method = config.get("scenario-method", "power-aware")
    if scenario == "pacing":
        add(
            f'`{method}` on fleet `{config["fleet"]}` with `pacing = "off"` and `pacing = '
            f'"deadline"` (pacing-margin {config["pacing-margin"]}); everything else equal.'
        )
    elif scenario == "varying-cap":
        add(
            f"`{method}` on `{config['varying-cap-fleet']}` (nodes with a `p-max-schedule`) "
            "and on the same fleet with each schedule replaced by its minimum cap "
            "(`fleets/*-fixed-at-minimum.toml` in this folder)."
        )
    else:
        add(
            f"`{method}` on `{config['drift-fleet']}` (twins that slow down / draw more from "
            f"some round) with `drift-check-every = {config['drift-check-every']}` "
            f"(threshold {config['drift-threshold']}) and with the check off."
        )
    add("")
    cols = [
        ("reached", None),
        ("rounds to target", "round-to-target"),
        ("time to target s", "time-to-target-s"),
        ("energy to target J", "energy-to-target-j"),
        ("idle wait to target J", "wait-energy-to-target-j"),
        ("sum to target J", "total-energy-to-target-j"),
        ("final acc.", "final-accuracy"),
        ("run: time s", "sim-time-s"),
        ("run: energy J", "energy-j"),
        ("run: sum J", "total-energy-j"),
    ]
    cols += [
        ("profiling energy J", "profile-energy-j"),
        ("round time after round 1 s", "round-time-after-1-s"),
        ("energy / round after round 1 J", "energy-per-round-after-1-j"),
        ("idle wait / round after round 1 J", "wait-per-round-after-1-j"),
        ("sum / round after round 1 J", "sum-per-round-after-1-j"),
    ]
    if scenario == "pacing":
        cols += [
            ("LUT-predicted saving / round J", "saved-per-round-after-1-j"),
            ("LUT-predicted saving to target J", "saved-to-target-j"),
            ("LUT-predicted saving, run J", "energy-saved-j"),
            ("deadline misses", "deadline-misses"),
        ]
    if scenario in ("varying-cap", "drift"):
        cols += [
            ("node-rounds failed", "node-rounds-failed"),
            ("node-rounds over cap", "over-cap-node-rounds"),
            ("time over cap s", "time-over-cap-s"),
        ]
    if scenario == "drift":
        cols += [("re-profiles", "drift-reprofiles")]
    add("| variant | " + " | ".join(c for c, _ in cols) + " |")
    add("|---|" + "---|" * len(cols))
    to_target = {
        "round-to-target",
        "time-to-target-s",
        "energy-to-target-j",
        "wait-energy-to-target-j",
        "total-energy-to-target-j",
        "saved-to-target-j",
    }
    for v in variants:
        g = sc[v]
        cells = []
        for _, q in cols:
            if q is None:
                cells.append(f"{g['seeds-reached']}/{g['seeds']}")
            elif q in to_target:
                cells.append(_reached(g, q, 1 if q == "round-to-target" else None))
            elif q == "final-accuracy":
                cells.append(_fmt(g[f"{q}-mean"], g[f"{q}-std"], 3))
            else:
                cells.append(_fmt(g[f"{q}-mean"], g[f"{q}-std"]))
        add(f"| {v} | " + " | ".join(cells) + " |")
    add("")
    # Paired per-seed comparison: the other variant against the reference.
    rows = []
    for q, label in (
        ("time-to-target-s", "time to target"),
        ("total-energy-to-target-j", "energy to target incl. idle waiting"),
        ("energy-to-target-j", "training + profiling energy to target"),
        ("profile-energy-j", "profiling energy"),
        ("round-time-after-1-s", "round time after round 1"),
        ("energy-per-round-after-1-j", "measured training energy per round after round 1"),
        ("sum-per-round-after-1-j", "training + idle waiting energy per round after round 1"),
        ("sim-time-s", "time, whole run"),
        ("total-energy-j", "energy incl. idle waiting, whole run"),
    ):
        pairs = _paired(summary, scenario, ref, other, q)
        if not pairs:
            rows.append(f"- {label}: no seed where both variants have it")
            continue
        diffs = [100.0 * (b - a) / a for _, a, b in pairs if a]
        per_seed = "; ".join(f"seed {s}: {a:.3g} → {b:.3g}" for s, a, b in pairs)
        rows.append(
            f"- {label}, {other} vs {ref}: {statistics.fmean(diffs):+.1f}% "
            f"(per seed {', '.join(f'{d:+.1f}%' for d in diffs)}; {per_seed})"
        )
    add("Paired by seed (same data and initial weights):")
    add("")
    for r in rows:
        add(r)
    if scenario == "pacing":
        noise = sc.get(ref, {}).get("time-to-target-s-std")
        r2t = _paired(summary, scenario, ref, other, "round-to-target")
        same = sum(1 for _, a, b in r2t if a == b)
        add(
            f"- rounds to target identical in {same}/{len(r2t)} seed(s) (pacing keeps every "
            "node's b*, so the learning dynamics are the same); seed-to-seed std of the "
            f"reference's time to target: {_fmt(noise)} s"
        )
        add(
            "- *saved* is what the paced nodes' LUTs predict they save against running at f* "
            "(the nodes report it); the *measured* effect is the difference in the twins' "
            "sensor energy per round above. Pacing profiles more points in a node's first "
            "round (the frequencies below f* it may pace to), which shows up as profiling "
            "energy and first-round time."
        )
    add("")
    if scenario in ("varying-cap", "drift"):
        for v in variants:
            recs = _by_use(records, scenario, v)
            add(f"**{v}: per node (whole run, mean over seeds)**")
            add("")
            _node_table(add, _mean_nodes(recs), _node_names(recs))
