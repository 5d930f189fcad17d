"""The balance study's section of the federated report: per fleet and arm (B1,
power-aware with ``balance`` off, samples, steps, energy), from the runs' records only.

* mean ± sd over seeds of rounds, time and energy to target (idle waiting included,
  profiling counted), over the seeds that reached the target; runs that missed it are
  counted and named, never averaged in;
* the paired per-seed ratio of each arm's time and energy to target against power-aware
  ``off`` (the per-device rule) and against B1: mean, min and max over the seeds where
  both runs reached the target;
* the attribution of each paired time ratio into rounds × time per round × profiling;
* node-rounds that met their deadline (runs with a round plan; goal ≥ 95%);
* the issue's goals as a check table (met / missed by how much);
* each fleet's straggler ratio: on the twins (``fleet_pace``) and as run.

The group numbers (``summary["scenarios"]["balance"]``) come from
``federated_metrics.aggregate``; this module reads them and the cell records, and knows
nothing of the rest of the report.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_client.balance import BALANCE_MODES, missed_deadline
from simulations.experiments import report_kit as kit
from simulations.experiments.federated_config import BALANCE_ARMS
from simulations.experiments.report_kit import NA, Doc

Rec = dict[str, Any]
Group = dict[str, Any]

ARM_LABELS = {"b1": "B1", **{name: mode.label for name, mode in BALANCE_MODES.items()}}
#: The issue's goals (mean over seeds of the paired ratios, profiling and idle counted).
TIME_GOAL = 0.77  # time ≤ 0.77× power-aware off …
ENERGY_NO_HIGHER = 1.0  # … with energy no higher
ENERGY_MODE_GOAL = 0.85  # or, balance = energy: energy ≤ 0.85× …
ENERGY_MODE_TIME = 1.01  # … at time ≤ 1.01×
B1_DEFAULT_GOAL = 0.5  # time ≤ 0.5× B1 on the default fleet
B1_ANY_GOAL = 1.0  # never later than B1 on any fleet
DEADLINE_GOAL = 0.95  # node-rounds that met their deadline
#: The modes with a round plan, each judged against ``off``.
MODES = tuple(name for name, mode in BALANCE_MODES.items() if mode.plans)


# --------------------------------------------------------------------------- per run


@dataclass(frozen=True)
class DeadlineCount:
    """Node-rounds of a run that had a deadline, and how they kept it."""

    node_rounds: int = 0
    late: int = 0  # local training time over the deadline (``balance.missed_deadline``)
    late_pace_setters: int = 0  # of them, nodes the plan made critical that round
    recorded_misses: int = 0  # rounds.jsonl's deadline-misses (the nodes' own strict flag)

    @property
    def met(self) -> int:
        return self.node_rounds - self.late

    def __add__(self, o: DeadlineCount) -> DeadlineCount:
        return DeadlineCount(
            self.node_rounds + o.node_rounds,
            self.late + o.late,
            self.late_pace_setters + o.late_pace_setters,
            self.recorded_misses + o.recorded_misses,
        )


def deadline_node_rounds(rec: Rec) -> DeadlineCount:
    """Node-rounds with a deadline (rounds.jsonl's ``deadline-s``) and which of them were
    late: the node's training time in nodes.jsonl over the round's deadline, by the
    node's own rule (``balance.missed_deadline``); the round plan in summary.json says
    which nodes set the pace."""
    deadline = {r["server-round"]: r["deadline-s"] for r in rec["rounds"]}
    critical = {
        e["round"]: set(e.get("critical", ())) for e in rec["summary"].get("round-plan", ())
    }
    total = late = pace = 0
    for n in rec["nodes"]:
        d = deadline.get(n["server-round"])
        if d is None or not n.get("ok"):
            continue
        total += 1
        if missed_deadline(float(n["train-time-s"]), float(d)):
            late += 1
            pace += n["node-name"] in critical.get(n["server-round"], set())
    recorded = sum(int(r["deadline-misses"]) for r in rec["rounds"] if r.get("deadline-s"))
    return DeadlineCount(total, late, pace, recorded)


def measured_straggler_ratio(rec: Rec) -> float | None:
    """The run's slowest node ÷ its median node by mean training time per round (over the
    rounds it trained; profiling, a round-1 cost, left out), from the summary's node
    totals."""
    per_round = [
        t["train-time-s"] / t["rounds-ok"]
        for t in rec["summary"]["nodes"].values()
        if t.get("rounds-ok")
    ]
    if len(per_round) < 2:
        return None
    med = statistics.median(per_round)
    return max(per_round) / med if med > 0 else None


# --------------------------------------------------------------------------- pairs


@dataclass(frozen=True)
class Paired:
    """Per-seed ratios arm ÷ reference over the seeds where both reached the target."""

    ratios: tuple[float, ...]
    seeds: int  # seeds where both arms ran

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.ratios) if self.ratios else None

    def text(self) -> str:
        """``0.83× (0.71–0.95, 4/5)``: mean (min–max, seeds paired / seeds run)."""
        if not self.ratios:
            return f"{NA} (0/{self.seeds})" if self.seeds else NA
        lo, hi = min(self.ratios), max(self.ratios)
        return f"{self.mean:.2f}× ({lo:.2f}–{hi:.2f}, {len(self.ratios)}/{self.seeds})"


def paired(arm: Group | None, ref: Group | None, q: str) -> Paired:
    """``q`` of ``arm`` ÷ ``ref`` seed by seed (both reached the target)."""
    if arm is None or ref is None:
        return Paired((), 0)
    a, r = arm["per-seed"], ref["per-seed"]
    both = sorted(set(a) & set(r))
    ratios = tuple(
        a[s][q] / r[s][q]
        for s in both
        if a[s]["reached"] and r[s]["reached"] and a[s][q] is not None and r[s][q]
    )
    return Paired(ratios, len(both))


def time_attribution(arm: Mapping[str, Any], ref: Mapping[str, Any]) -> dict[str, float] | None:
    """One seed's time-to-target ratio arm ÷ ref split exactly into ``rounds`` (rounds to
    target), ``per-round`` (mean round time with profiling counted as free) and
    ``profiling`` (time as run ÷ time with free profiling, arm over ref); their product is
    ``ratio``. None when either run missed the target."""
    keys = ("time-to-target-s", "time-to-target-free-profiling-s", "round-to-target")
    vals = [arm.get(k) for k in keys] + [ref.get(k) for k in keys]
    if any(v is None or not v > 0 for v in vals):
        return None
    t_a, free_a, r_a, t_r, free_r, r_r = (float(v) for v in vals)  # type: ignore[arg-type]
    return {
        "ratio": t_a / t_r,
        "rounds": r_a / r_r,
        "per-round": (free_a / r_a) / (free_r / r_r),
        "profiling": (t_a / free_a) / (t_r / free_r),
    }


def mean_attribution(arm: Group | None, ref: Group | None) -> dict[str, float] | None:
    """Geometric means over the paired seeds of ``time_attribution``'s factors (their
    product is the geometric mean of the ratios), with the number of seeds."""
    if arm is None or ref is None:
        return None
    both = sorted(set(arm["per-seed"]) & set(ref["per-seed"]))
    parts = [time_attribution(arm["per-seed"][s], ref["per-seed"][s]) for s in both]
    ok = [p for p in parts if p is not None]
    if not ok:
        return None
    out = {k: math.exp(statistics.fmean(math.log(p[k]) for p in ok)) for k in ok[0]}
    out["seeds"] = float(len(ok))
    return out


# --------------------------------------------------------------------------- goals


@dataclass(frozen=True)
class Goal:
    """One goal's check: ``value`` against ``limit`` (met when value ≤ limit)."""

    fleet: str
    arm: str
    goal: str
    value: float | None
    limit: float
    extra: str = ""  # the side condition's value, e.g. "energy 0.97×"
    extra_ok: bool = True

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value <= self.limit and self.extra_ok

    def verdict(self) -> str:
        if self.value is None:
            return "not measured (no paired seed)"
        if self.met:
            return "met"
        if self.value > self.limit:
            return f"missed by {100 * (self.value / self.limit - 1):.0f}% ({self.value:.2f}×)"
        return f"missed: {self.extra}"


def goals(groups: Mapping[str, Mapping[str, Group]], default_fleet: str) -> list[Goal]:
    """The issue's goals per fleet (``groups``: fleet → arm → group)."""
    out: list[Goal] = []
    for fleet, arms in groups.items():
        off, b1 = arms.get("off"), arms.get("b1")
        for name, arm in arms.items():
            mode = name.partition("@")[0]
            if mode not in MODES:
                continue
            t, e = paired(arm, off, "time-to-target-s"), paired(arm, off, "energy-to-target-j")
            e_txt = f"energy {e.mean:.2f}× off" if e.mean is not None else "energy n/a"
            out.append(
                Goal(
                    fleet,
                    name,
                    f"time ≤ {TIME_GOAL}× off, energy ≤ {ENERGY_NO_HIGHER:g}×",
                    t.mean,
                    TIME_GOAL,
                    e_txt,
                    e.mean is not None and e.mean <= ENERGY_NO_HIGHER,
                )
            )
            if mode == "energy":
                t_txt = f"time {t.mean:.2f}× off" if t.mean is not None else "time n/a"
                out.append(
                    Goal(
                        fleet,
                        name,
                        f"energy ≤ {ENERGY_MODE_GOAL}× off at time ≤ {ENERGY_MODE_TIME}×",
                        e.mean,
                        ENERGY_MODE_GOAL,
                        t_txt,
                        t.mean is not None and t.mean <= ENERGY_MODE_TIME,
                    )
                )
        for arm_name, arm in arms.items():
            if arm_name == "b1":
                continue
            t_b1 = paired(arm, b1, "time-to-target-s")
            limit = B1_DEFAULT_GOAL if fleet == default_fleet else B1_ANY_GOAL
            out.append(Goal(fleet, arm_name, f"time ≤ {limit:g}× B1", t_b1.mean, limit))
    return out


# --------------------------------------------------------------------------- the section


def _fleet_groups(summary: Mapping[str, Any]) -> dict[str, dict[str, Group]]:
    """fleet → arm → group, fleets in run order, arms in ``BALANCE_ARMS`` order, then the
    weighted arms (``critical-r-arms``, ``MODE@W``) by mode and weight."""
    out: dict[str, dict[str, Group]] = {}
    for variant, g in summary["scenarios"].get("balance", {}).items():
        fleet, _, arm = variant.rpartition("/")
        out.setdefault(fleet, {})[arm] = g

    def order(arm: str) -> tuple[int, int, float]:
        mode, _, w = arm.partition("@")
        return (0 if not w else 1, BALANCE_ARMS.index(mode), float(w or 0))

    known = {f: [a for a in arms if a.partition("@")[0] in BALANCE_ARMS] for f, arms in out.items()}
    return {f: {a: out[f][a] for a in sorted(names, key=order)} for f, names in known.items()}


def arm_label(arm: str) -> str:
    """``balance = steps`` or, for a weighted arm ``steps@0.5``, ``balance = steps,
    critical-r-weight 0.5``."""
    mode, _, w = arm.partition("@")
    return ARM_LABELS[mode] + (f", critical-r-weight {w}" if w else "")


def _reached(g: Group, q: str, digits: int | None = None) -> str:
    if g["seeds-reached"] == 0:
        return "not reached"
    return kit.fmt(g[f"{q}-mean"], g[f"{q}-std"], digits)


def _missed(g: Group) -> str:
    """Seeds that missed the target, with their final accuracy."""
    miss = [
        f"seed {s} ({m['final-accuracy']:.3f})"
        for s, m in sorted(g["per-seed"].items())
        if not m["reached"]
    ]
    return ", ".join(miss) if miss else "none"


def _records_of(records: Iterable[Rec], variant: str) -> list[Rec]:
    return [r for r in records if ["balance", variant] in r["uses"]]


def _deadline_text(recs: list[Rec]) -> str:
    c = sum((deadline_node_rounds(r) for r in recs), DeadlineCount())
    if c.node_rounds == 0:
        return "no deadline"
    txt = f"{100 * c.met / c.node_rounds:.1f}% of {c.node_rounds}"
    if c.late:
        txt += f" ({c.late_pace_setters} of {c.late} late by the pace-setter)"
    if c.recorded_misses != c.late:
        txt += f"; {c.recorded_misses} flagged by the nodes"
    return txt


def _pace_text(fleet: str, recs: list[Rec]) -> str:
    """The fleet's straggler ratio on the twins (equal data shares) and as run."""
    from simulations.experiments.fleet_pace import fleet_pace  # torch: only for the report

    path = recs[0]["settings"].get("fleet", fleet) if recs else fleet
    try:
        twin = f"{fleet_pace(path).ratio:.2f}×"
    except (OSError, ValueError) as exc:
        twin = f"n/a ({exc})"
    runs = [x for x in (measured_straggler_ratio(r) for r in recs) if x is not None]
    ran = kit.fmt(*kit.mean_std(runs), digits=2) + "×" if runs else NA
    return f"twins (equal data shares) {twin}; as run (power-aware off, mean ± sd) {ran}"


def section(
    doc: Doc, summary: Mapping[str, Any], records: list[Rec], config: Mapping[str, Any]
) -> None:
    """The balance study: a table per fleet, the attribution, and the goals."""
    groups = _fleet_groups(summary)
    if not groups:
        return
    doc.add(
        "## Balance modes across fleets",
        "",
        "Each fleet runs B1 and power-aware with each `balance` mode on the same seeds (the "
        "same data split and initial weights). Time and energy are to the target (the round "
        "whose mean accuracy over the last "
        f"{int(config.get('target-window', 1))} round(s) first reaches it, the runs' "
        "`round-to-target`), profiling counted and idle waiting included; mean ± sd over the "
        "seeds that reached the "
        "target. Ratios are paired per seed (arm ÷ reference, over the seeds where both "
        "reached the target): mean (min–max, seeds paired / seeds run). *Deadline met*: "
        "node-rounds whose training time was within the round plan's deadline (only runs "
        "with a plan have one; goal ≥ 95%; within a relative 1e-9: the nodes' own flag, "
        "also shown where it differs, counts a pace-setter that matched its own forecast "
        "to one float ulp over as late). *Straggler ratio*: the slowest node's round time ÷ the "
        "median node's (`python -m simulations.experiments.fleet_pace`; as run: mean training "
        "time per round, with the seed's data split and the chosen cells).",
        "",
    )
    for fleet, arms in groups.items():
        _fleet_table(doc, fleet, arms, records)
    main = Path(str(config.get("fleet", "default"))).stem  # the study's fleet: a path or name
    _goal_table(doc, groups, next((f for f in groups if Path(f).stem == main), main))


def _fleet_table(doc: Doc, fleet: str, arms: dict[str, Group], records: list[Rec]) -> None:
    off, b1 = arms.get("off"), arms.get("b1")
    doc.add(f"### Fleet `{fleet}`", "")
    doc.add(f"Straggler ratio: {_pace_text(fleet, _records_of(records, f'{fleet}/off'))}.", "")
    doc.table(
        (
            "arm",
            "reached",
            "rounds",
            "time s",
            "energy J",
            "profiling",
            "time ÷ off",
            "energy ÷ off",
            "time ÷ B1",
            "energy ÷ B1",
            "deadline met",
            "missed target",
        )
    )
    for arm, g in arms.items():
        doc.row(
            arm_label(arm),
            f"{g['seeds-reached']}/{g['seeds']}",
            _reached(g, "round-to-target", 1),
            _reached(g, "time-to-target-s", 2),
            _reached(g, "energy-to-target-j", 1),
            kit.fmt(g["profile-share-mean"], digits=3),
            "—" if arm == "off" else paired(g, off, "time-to-target-s").text(),
            "—" if arm == "off" else paired(g, off, "energy-to-target-j").text(),
            "—" if arm == "b1" else paired(g, b1, "time-to-target-s").text(),
            "—" if arm == "b1" else paired(g, b1, "energy-to-target-j").text(),
            _deadline_text(_records_of(records, f"{fleet}/{arm}")),
            _missed(g),
        )
    doc.add("")
    doc.add("Time ratio = rounds × time per round × profiling (geometric means over paired seeds):")
    doc.add("")
    doc.table(("arm", "÷ off", "÷ B1"))
    for arm, g in arms.items():
        doc.row(
            arm_label(arm),
            _attribution_text(mean_attribution(g, off)) if arm != "off" else "—",
            _attribution_text(mean_attribution(g, b1)) if arm != "b1" else "—",
        )
    doc.add("")


def _attribution_text(a: dict[str, float] | None) -> str:
    if a is None:
        return NA
    return (
        f"{a['ratio']:.2f} = {a['rounds']:.2f} × {a['per-round']:.2f} × {a['profiling']:.2f} "
        f"({int(a['seeds'])} seeds)"
    )


def _goal_table(doc: Doc, groups: Mapping[str, Mapping[str, Group]], default_fleet: str) -> None:
    doc.add(
        "### Goals (mean over seeds of the paired ratios)",
        "",
        f"Node-rounds within their deadline: goal ≥ {100 * DEADLINE_GOAL:.0f}% (column "
        "*deadline met* above).",
        "",
    )
    doc.table(("fleet", "arm", "goal", "verdict"))
    for g in goals(groups, default_fleet):
        doc.row(f"`{g.fleet}`", g.arm, g.goal, g.verdict())
    doc.add("")
