"""The robustness study's report: every arm over every (fleet, seed) pair, under two
target criteria.

A *pair* is one fleet and one seed: every arm of a pair has the same data split and
initial weights. For each run and criterion the report reads, from the run's per-round
records (``rounds.jsonl``: accuracy, cumulative simulated time and fleet energy) and
per-node records (``nodes.jsonl``: train, profile and fleet-shared profile time):

* ``first``: the first round whose accuracy is at or over the target (the runs'
  ``first-round-at-target``);
* ``smoothed``: the first round whose mean accuracy over it and the ``target-window`` − 1
  rounds before reaches the target (a lucky round does not decide it; the runs'
  ``round-to-target``, at which they stop);

and, up to that round, the simulated time, the fleet energy with idle waiting counted
(training + profiling + idle) and the profiling share of device time. Per arm and
criterion: pairs that reach the target, paired ratios of time and energy against each
arm of ``ratio-against`` (median, 10th percentile and worst over the pairs where both
reach it, and in how many the arm is no later / uses no more), every pair where one of
the two reaches the target and the other does not, and the runs where the two criteria
disagree. ``summary.json`` holds the same figures. The section "Choosing the default"
(``robustness_verdict``) holds every power-aware arm to issue 32's four criteria and
proposes the default.

Both rules are the run's own (``fl_server.target``), applied to the per-round records, so
they agree with the fields each run wrote. A folder of an earlier version of the study (its
runs went on to ``num-rounds``; its window was ``smoothing-rounds``) reads the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fl_server.target import first_round_at, window_round
from simulations.experiments import report_kit as kit
from simulations.experiments.records import write_json
from simulations.experiments.report_kit import Doc
from simulations.experiments.robustness_verdict import choose_default
from simulations.experiments.robustness_verdict import section as default_section

CRITERIA = ("first", "smoothed")
CRITERION_TITLES = {
    "first": "first round at or over the target",
    "smoothed": "first round whose trailing mean reaches the target",
}
Rec = dict[str, Any]


@dataclass(frozen=True)
class Reach:
    """One run under one criterion: the round that reached the target (None: missed) and
    the time, energy (idle counted) and profiling share up to it (to the run's end when
    missed)."""

    round: int | None
    time_s: float
    energy_j: float
    profile_share: float

    @property
    def reached(self) -> bool:
        return self.round is not None


def reach(rec: Mapping[str, Any], round_: int | None) -> Reach:
    """A run's time, energy (busy + idle) and profiling share up to ``round_`` (its last
    round when None)."""
    rows = sorted(rec["rounds"], key=lambda r: r["server-round"])
    upto = round_ if round_ is not None else len(rows)
    if not rows or upto < 1:
        return Reach(round_, 0.0, 0.0, 0.0)
    last = rows[upto - 1]
    busy = sum(r["round-busy-energy-j"] for r in rows[:upto])
    idle = sum(r["round-idle-energy-j"] for r in rows[:upto])
    nodes = [n for n in rec.get("nodes", []) if n.get("server-round", 0) <= upto]
    prof = sum(n.get("profile-time-s", 0.0) + n.get("shared-time-s", 0.0) for n in nodes)
    train = sum(n.get("train-time-s", 0.0) for n in nodes)
    share = prof / (prof + train) if prof + train > 0 else 0.0
    return Reach(round_, float(last["sim-time-s"]), busy + idle, share)


def run_outcomes(rec: Mapping[str, Any], target: float, window: int) -> dict[str, Reach]:
    """Both criteria of one run."""
    accs = [r["accuracy"] for r in sorted(rec["rounds"], key=lambda r: r["server-round"])]
    return {
        "first": reach(rec, first_round_at(accs, target)),
        "smoothed": reach(rec, window_round(accs, target, window)),
    }


def pairs_of(
    records: Sequence[Rec], target: float, window: int
) -> dict[tuple[str, int], dict[str, dict[str, Reach]]]:
    """(fleet, seed) → arm → criterion → Reach, for every arm a record is used by. Two
    records for one (fleet, seed, arm) (cells of two plans in one folder: an earlier
    version's and this one's) are a ReportError naming them, never one chosen silently."""
    out: dict[tuple[str, int], dict[str, dict[str, Reach]]] = {}
    seen: dict[tuple[str, int, str], Rec] = {}
    for rec in records:
        outcome = run_outcomes(rec, target, window)
        for fleet, arm in rec["uses"]:
            other = seen.setdefault((fleet, int(rec["seed"]), arm), rec)
            if other is not rec:
                raise kit.ReportError(_two_records(fleet, int(rec["seed"]), arm, other, rec))
            out.setdefault((fleet, int(rec["seed"])), {})[arm] = outcome
    return out


def _two_records(fleet: str, seed: int, arm: str, a: Rec, b: Rec) -> str:
    def name(r: Rec) -> str:
        return f"{str(r.get('key', '?'))[:12]} (cell version {r.get('cell-version', '?')})"

    return (
        f"records/cells: two runs of fleet {fleet}, seed {seed}, arm {arm}: {name(a)} and "
        f"{name(b)}; the folder holds the cells of two plans (settings or versions of the "
        "study). Run the study into a new folder (--out), or move the records that are not "
        "this plan's out of records/cells"
    )


def _stats(xs: Sequence[float]) -> dict[str, Any]:
    """Median, 10th percentile and worst (largest) of paired ratios (lower is better), and
    how many are ≤ 1."""
    if not xs:
        return {"n": 0, "median": None, "p10": None, "worst": None, "at-most-1": 0}
    a = np.asarray(xs, dtype=float)
    return {
        "n": len(xs),
        "median": float(np.median(a)),
        "p10": float(np.percentile(a, 10)),
        "worst": float(a.max()),
        "at-most-1": int((a <= 1.0 + 1e-12).sum()),
    }


def summarize(
    pairs: Mapping[tuple[str, int], Mapping[str, Mapping[str, Reach]]],
    arms: Sequence[str],
    refs: Sequence[str],
) -> dict[str, Any]:
    """Per criterion and arm: reached counts, paired ratios against each ref, the pairs
    where one of the two reaches the target and the other does not, and the profiling
    share; plus the runs where the two criteria disagree."""
    keys = sorted(pairs)
    out: dict[str, Any] = {"pairs": len(keys), "criteria": {}, "disagreements": []}
    for crit in CRITERIA:
        per_arm: dict[str, Any] = {}
        for arm in arms:
            runs = [(k, pairs[k][arm][crit]) for k in keys if arm in pairs[k]]
            shares = [r.profile_share for _, r in runs if r.reached]
            entry: dict[str, Any] = {
                "runs": len(runs),
                "reached": sum(r.reached for _, r in runs),
                "profile-share-median": float(np.median(shares)) if shares else None,
                "against": {},
            }
            for ref in refs:
                if ref == arm:
                    continue
                t, e, split = [], [], []
                for k in keys:
                    a, b = pairs[k].get(arm), pairs[k].get(ref)
                    if a is None or b is None:
                        continue
                    ra, rb = a[crit], b[crit]
                    if ra.reached and rb.reached:
                        t.append(ra.time_s / rb.time_s)
                        e.append(ra.energy_j / rb.energy_j)
                    elif ra.reached != rb.reached:
                        split.append(
                            {
                                "fleet": k[0],
                                "seed": k[1],
                                "reached-by": arm if ra.reached else ref,
                                "arm-round": ra.round,
                                "ref-round": rb.round,
                            }
                        )
                entry["against"][ref] = {"time": _stats(t), "energy": _stats(e), "split": split}
            per_arm[arm] = entry
        out["criteria"][crit] = per_arm
    for k in keys:
        for arm in arms:
            if arm in pairs[k]:
                f, s = pairs[k][arm]["first"], pairs[k][arm]["smoothed"]
                if f.round != s.round:
                    out["disagreements"].append(
                        {
                            "fleet": k[0],
                            "seed": k[1],
                            "arm": arm,
                            "first-round": f.round,
                            "smoothed-round": s.round,
                            "first-time-s": f.time_s if f.reached else None,
                            "smoothed-time-s": s.time_s if s.reached else None,
                        }
                    )
    return out


def _r(x: float | None) -> str:
    return kit.NA if x is None or not math.isfinite(x) else f"{x:.2f}×"


def _pct(x: float | None) -> str:
    return kit.NA if x is None else f"{100 * x:.1f}%"


def _round(x: int | None) -> str:
    return "missed" if x is None else str(x)


def _criterion_section(
    doc: Doc, summary: Mapping[str, Any], crit: str, arms: Sequence[str], refs: Sequence[str]
) -> None:
    per_arm = summary["criteria"][crit]
    doc.add(f"## Criterion: {CRITERION_TITLES[crit]}", "")
    header = ["arm", "reached (pairs)", "profiling share (median)"]
    for ref in refs:
        header += [
            f"time ÷ {ref}: median · p10 · worst (≤ 1)",
            f"energy ÷ {ref}: median · p10 · worst (≤ 1)",
        ]
    doc.table(header)
    for arm in arms:
        e = per_arm[arm]
        row = [f"`{arm}`", f"{e['reached']}/{e['runs']}", _pct(e["profile-share-median"])]
        for ref in refs:
            if ref == arm:
                row += ["—", "—"]
                continue
            for q in ("time", "energy"):
                s = e["against"][ref][q]
                row.append(
                    kit.NA
                    if not s["n"]
                    else f"{_r(s['median'])} · {_r(s['p10'])} · {_r(s['worst'])} "
                    f"({s['at-most-1']}/{s['n']})"
                )
        doc.row(*row)
    doc.add("")
    splits = [
        (arm, ref, x)
        for arm in arms
        for ref in refs
        if ref != arm
        for x in per_arm[arm]["against"][ref]["split"]
    ]
    doc.add("Pairs where one of the two arms reaches the target and the other does not:", "")
    if not splits:
        doc.add("none.", "")
        return
    doc.table(("arm", "against", "fleet", "seed", "reached by", "arm's round", "other's round"))
    for arm, ref, x in splits:
        doc.row(
            f"`{arm}`",
            f"`{ref}`",
            x["fleet"],
            str(x["seed"]),
            f"`{x['reached-by']}`",
            _round(x["arm-round"]),
            _round(x["ref-round"]),
        )
    doc.add("")


def _disagreement_section(doc: Doc, summary: Mapping[str, Any], window: int) -> None:
    rows = summary["disagreements"]
    doc.add("## Where the two criteria disagree", "")
    doc.add(
        f"Runs whose first round at the target differs from the first round whose mean over "
        f"{window} rounds reaches it ({len(rows)} of the runs):",
        "",
    )
    if not rows:
        return
    doc.table(
        ("fleet", "seed", "arm", "first round", "smoothed round", "time s (first → smoothed)")
    )
    for x in rows:
        times = (
            f"{kit.fmt(x['first-time-s'], digits=2)} → {kit.fmt(x['smoothed-time-s'], digits=2)}"
        )
        doc.row(
            x["fleet"],
            str(x["seed"]),
            f"`{x['arm']}`",
            _round(x["first-round"]),
            _round(x["smoothed-round"]),
            times,
        )
    doc.add("")


def _wall_note(doc: Doc, output: kit.Output, records: Sequence[Rec]) -> None:
    manifest, counts = output.manifest, output.manifest.get("counts", {})
    walls = [float(r["host-wall-s"]) for r in records if "host-wall-s" in r]
    engines = sorted({str(r.get("engine", "runtime")) for r in records})
    per_run = (
        f"host wall time per run {np.median(walls):.0f} s median "
        f"({min(walls):.0f}–{max(walls):.0f} s, {', '.join(engines)} engine)"
        if walls
        else "no runs"
    )
    doc.add(
        f"Wall time of the last `run`: {kit.fmt(manifest.get('wall-s'), digits=0)} s on "
        f"{manifest.get('host', {}).get('cpus', '?')} CPU core(s) (cells run "
        f"{counts.get('cells-done', '?')}, reused {counts.get('cells-reused', '?')}, failed "
        f"{counts.get('cells-failed', '?')}); {per_run}.",
        "",
    )
    for f in counts.get("failures", []):
        doc.add(f"- failed: {f}")
    if counts.get("failures"):
        doc.add("")


def render(out: Path) -> Path:
    """Write summary.json and report.md into ``out`` from its records; return report.md."""
    output = kit.load_output(out)
    config = output.config
    records = output.records("cells")
    target = float(config["target-accuracy"])
    # the window: the runs' target-window; a folder of an earlier version: smoothing-rounds
    window = int(config.get("target-window", config.get("smoothing-rounds", 1)))
    arms = [a["name"] for a in config["arms"]]
    refs = [r for r in config["ratio-against"] if r in arms]
    pairs = pairs_of(records, target, window)
    summary = summarize(pairs, arms, refs)
    choice = choose_default(pairs, records, config)
    fleets = sorted({k[0] for k in pairs})
    write_json(
        out / "summary.json",
        {
            "target-accuracy": target,
            "target-window": window,
            "fleets": fleets,
            "arms": arms,
            "ratio-against": refs,
            **summary,
            "choosing-the-default": choice,
            "runs": [
                {
                    "fleet": k[0],
                    "seed": k[1],
                    "arm": arm,
                    **{
                        crit: {
                            "round": r.round,
                            "time-s": r.time_s,
                            "energy-j": r.energy_j,
                            "profile-share": r.profile_share,
                        }
                        for crit, r in by_crit.items()
                    },
                }
                for k in sorted(pairs)
                for arm, by_crit in pairs[k].items()
            ],
        },
    )
    doc = Doc()
    kit.experiment_head(doc, output, "robustness study", f"{len(records)} run records")
    _wall_note(doc, output, records)
    doc.add(
        f"{summary['pairs']} pairs (fleet × seed) over {len(fleets)} fleets "
        f"({', '.join(fleets)}); target accuracy {target:g}. Time and energy are simulated, to "
        "the round that reached the target; energy counts training, profiling and the idle "
        "power of nodes waiting for the round's slowest. Ratios are paired (same fleet and "
        "seed) over the pairs where both arms reach the target: median, 10th percentile, "
        "worst (largest), and in brackets the pairs where the arm is no later (time) or uses "
        "no more (energy), of those pairs. Profiling share: profiling's share of the fleet's "
        "device time to the target (median over the runs that reached it).",
        "",
    )
    default_section(doc, choice, CRITERION_TITLES)
    for crit in CRITERIA:
        _criterion_section(doc, summary, crit, arms, refs)
    _disagreement_section(doc, summary, window)
    kit.settings_section(doc, config)
    kit.provenance_section(doc, output.manifest)
    return doc.write(out / "report.md")
