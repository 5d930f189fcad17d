"""Choosing the default from the robustness study (issue 32, item 3), and issue 33's
goals for an asynchronous (``fedbuff``) arm.

Every power-aware arm is held to the four criteria below, per target criterion
(``smoothed``: the run's own rule, which decides; ``first``: shown beside it), over the
(fleet, seed) pairs where the arm and the reference (B1 or ``off``) both have a run:

* (a) it never misses a target that B1 reaches (denominator: the pairs where B1 reaches);
* (b) it takes no longer than B1 in ≥ ``NO_LATER_THAN_B1_SHARE`` of the pairs, and the
  median of its paired time ratios is ≥ ``SOONER_THAN_B1_X`` times sooner;
* (c) it uses no more energy (idle counted) than B1 in ≥ ``NO_MORE_ENERGY_THAN_B1_SHARE``;
* (d) it takes no longer than ``off`` in ≥ ``NO_LATER_THAN_OFF_SHARE`` of the pairs.

The pairs of (b)–(d) are those where at least one of the two reaches the target. Where
only the reference reaches it the arm is later and uses more (ratio ∞); where only the arm
reaches it the reference's figures to the end of its run (a lower bound of its own to the
target) stand in, so that ratio is an upper bound; a pair where neither reaches it is left
out and listed. The proposal: among the arms that meet all four, synchronous or not, the
fastest by median time ratio against B1; if none does, the safest (fewest misses of
targets B1 reaches, then fewest pairs later than ``off``, then the lowest median time
ratio), with the criteria it fails. The same choice among the synchronous arms alone gives
the synchronous default an asynchronous arm is compared with.

An arm whose runs aggregate with ``fedbuff`` (asynchronous: its "rounds" are model
versions) is also held to issue 33's goals: no miss of a target B1 reaches, an idle share
(the run summary's ``idle-share``) ≤ ``ASYNC_IDLE_SHARE_MAX`` in every run, a median time
ratio against B1 ≤ ``ASYNC_TIME_VS_B1_MAX``, no later than the synchronous default
in ≥ ``ASYNC_NO_LATER_THAN_DEFAULT_SHARE`` of the pairs and no more energy than B1 in
≥ ``ASYNC_NO_MORE_ENERGY_THAN_B1_SHARE``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fl_client.settings import RunSettings
from simulations.experiments.report_kit import Doc

# --------------------------------------------------------------------------- thresholds
#: (a) targets B1 reaches that the default may miss
MAX_B1_TARGETS_MISSED = 0
#: (b) share of pairs in which the default takes no longer than B1
NO_LATER_THAN_B1_SHARE = 0.95
#: (b) how many times sooner than B1 the default must be, by the median paired time ratio
SOONER_THAN_B1_X = 1.5
#: (b) the aim beside it
SOONER_THAN_B1_AIM_X = 2.0
#: (c) share of pairs in which the default uses no more energy (idle counted) than B1
NO_MORE_ENERGY_THAN_B1_SHARE = 0.90
#: (d) share of pairs in which the default takes no longer than ``off``
NO_LATER_THAN_OFF_SHARE = 0.95
#: issue 33: the largest idle share of the fleet's time in any run of an asynchronous arm
ASYNC_IDLE_SHARE_MAX = 0.05
#: issue 33: the largest median paired time ratio against B1
ASYNC_TIME_VS_B1_MAX = 0.5
#: issue 33: share of pairs in which it takes no longer than the synchronous default
ASYNC_NO_LATER_THAN_DEFAULT_SHARE = 0.90
#: issue 33: share of pairs in which it uses no more energy (idle counted) than B1
ASYNC_NO_MORE_ENERGY_THAN_B1_SHARE = 0.90

THRESHOLDS = {
    "max-b1-targets-missed": MAX_B1_TARGETS_MISSED,
    "no-later-than-b1-share": NO_LATER_THAN_B1_SHARE,
    "sooner-than-b1-x": SOONER_THAN_B1_X,
    "sooner-than-b1-aim-x": SOONER_THAN_B1_AIM_X,
    "no-more-energy-than-b1-share": NO_MORE_ENERGY_THAN_B1_SHARE,
    "no-later-than-off-share": NO_LATER_THAN_OFF_SHARE,
    "async-idle-share-max": ASYNC_IDLE_SHARE_MAX,
    "async-time-vs-b1-max": ASYNC_TIME_VS_B1_MAX,
    "async-no-later-than-default-share": ASYNC_NO_LATER_THAN_DEFAULT_SHARE,
    "async-no-more-energy-than-b1-share": ASYNC_NO_MORE_ENERGY_THAN_B1_SHARE,
}
#: The target criteria judged, the deciding one first (the run's own rule)
VERDICT_CRITERIA = ("smoothed", "first")
CHECK_TITLES = {
    "a": "(a) never misses a target B1 reaches",
    "b-share": "(b) no later than B1",
    "b-median": "(b) median time ÷ B1",
    "c": "(c) energy no more than B1's",
    "d": "(d) no later than `off`",
    "idle": "idle share of the fleet's time",
    "time-b1": "median time ÷ B1",
    "time-default": "no later than the synchronous default",
    "energy-b1": "energy no more than B1's",
}
CHECK_SHORT = {
    "a": "(a)",
    "b-share": "(b) share",
    "b-median": "(b) median",
    "c": "(c)",
    "d": "(d)",
    "idle": "idle",
    "time-b1": "time ÷ B1",
    "time-default": "time ÷ default",
    "energy-b1": "energy",
}
EPS = 1e-12
Pair = tuple[str, int]


class Outcome(Protocol):
    """One run under one criterion (``robustness_report.Reach``)."""

    @property
    def reached(self) -> bool: ...

    @property
    def time_s(self) -> float: ...

    @property
    def energy_j(self) -> float: ...


Pairs = Mapping[Pair, Mapping[str, Mapping[str, Outcome]]]


@dataclass(frozen=True)
class Paired:
    """An arm against a reference under one criterion: time and energy ratios over the
    pairs where at least one reaches the target (∞ where only the reference does)."""

    time: tuple[float, ...]
    energy: tuple[float, ...]
    ref_reached: int  # pairs where the reference reaches the target
    missed: int  # ... and the arm does not
    neither: tuple[Pair, ...]  # pairs where neither does: left out
    absent: int  # pairs without a run of the arm or of the reference: left out

    @property
    def n(self) -> int:
        return len(self.time)

    @property
    def no_later(self) -> int:
        return sum(t <= 1.0 + EPS for t in self.time)

    @property
    def no_more_energy(self) -> int:
        return sum(e <= 1.0 + EPS for e in self.energy)

    @property
    def median_time(self) -> float | None:
        return float(np.median(self.time)) if self.time else None


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def paired(pairs: Pairs, arm: str, ref: str, crit: str) -> Paired:
    """``arm`` against ``ref`` under ``crit`` over every pair (see the module docstring)."""
    time: list[float] = []
    energy: list[float] = []
    ref_reached = missed = absent = 0
    neither: list[Pair] = []
    for key in sorted(pairs):
        runs = pairs[key]
        if arm not in runs or ref not in runs:
            absent += 1
            continue
        a, b = runs[arm][crit], runs[ref][crit]
        ref_reached += b.reached
        if not a.reached and not b.reached:
            neither.append(key)
        elif not a.reached:
            missed += 1
            time.append(math.inf)
            energy.append(math.inf)
        else:
            time.append(_ratio(a.time_s, b.time_s))
            energy.append(_ratio(a.energy_j, b.energy_j))
    return Paired(tuple(time), tuple(energy), ref_reached, missed, tuple(neither), absent)


# --------------------------------------------------------------------------- checks


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _check(key: str, ok: bool, measured: str, needs: str, value: float | None) -> dict[str, Any]:
    return {
        "check": key,
        "title": CHECK_TITLES[key],
        "value": None if value is None or not math.isfinite(value) else value,
        "measured": measured,
        "needs": needs,
        "pass": bool(ok),
    }


def _misses(key: str, p: Paired) -> dict[str, Any]:
    ok = p.missed <= MAX_B1_TARGETS_MISSED
    measured = f"{p.missed} missed of {p.ref_reached} pairs where B1 reaches it"
    needs = "none missed" if MAX_B1_TARGETS_MISSED == 0 else f"≤ {MAX_B1_TARGETS_MISSED}"
    return _check(key, ok, measured, needs, float(p.missed))


def _share(key: str, k: int, n: int, need: float, what: str) -> dict[str, Any]:
    if not n:
        return _check(key, False, "no pairs to judge", f"≥ {need:.0%}", None)
    share = k / n
    return _check(
        key, share >= need - EPS, f"{k}/{n} pairs {what} = {_pct(share)}", f"≥ {need:.0%}", share
    )


def median_text(m: float | None) -> str:
    """A median time ratio and how many times sooner it is."""
    if m is None:
        return "no pairs"
    if not math.isfinite(m):
        return "∞ (misses the target in most pairs)"
    return f"{m:.2f}× = {1 / m:.2f}× sooner" if m > 0 else f"{m:.2f}×"


def _sooner(key: str, m: float | None, max_ratio: float, needs: str) -> dict[str, Any]:
    ok = m is not None and m <= max_ratio + EPS
    return _check(key, ok, median_text(m), needs, m)


def judge_arm(pairs: Pairs, arm: str, refs: tuple[str, str], crit: str) -> dict[str, Any]:
    """Issue 32's four criteria for ``arm`` (``refs``: B1's arm and ``off``'s)."""
    vb, vo = paired(pairs, arm, refs[0], crit), paired(pairs, arm, refs[1], crit)
    checks = [
        _misses("a", vb),
        _share("b-share", vb.no_later, vb.n, NO_LATER_THAN_B1_SHARE, "no later than B1"),
        _sooner(
            "b-median",
            vb.median_time,
            1.0 / SOONER_THAN_B1_X,
            f"≥ {SOONER_THAN_B1_X:g}× sooner, aim {SOONER_THAN_B1_AIM_X:g}×",
        ),
        _share(
            "c", vb.no_more_energy, vb.n, NO_MORE_ENERGY_THAN_B1_SHARE, "no more energy than B1"
        ),
        _share("d", vo.no_later, vo.n, NO_LATER_THAN_OFF_SHARE, f"no later than `{refs[1]}`"),
    ]
    return {
        "arm": arm,
        "checks": checks,
        "meets-all": all(c["pass"] for c in checks),
        "fails": [c["check"] for c in checks if not c["pass"]],
        "median-time-vs-b1": vb.median_time,
        "b1-targets-missed": vb.missed,
        "later-than-off": vo.n - vo.no_later,
        "neither-reaches": {
            ref: [list(k) for k in p.neither] for ref, p in zip(refs, (vb, vo), strict=True)
        },
    }


def _safety(j: Mapping[str, Any]) -> tuple[float, float, float]:
    m = j["median-time-vs-b1"]
    return (j["b1-targets-missed"], j["later-than-off"], math.inf if m is None else m)


def choose(judged: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Among ``judged``: those that meet all four, and the proposal."""
    passing = [j for j in judged if j["meets-all"]]
    if passing:
        best = min(passing, key=lambda j: _safety(j)[2])
        return {
            "meets-all": [j["arm"] for j in passing],
            "proposed": best["arm"],
            "proposed-as": "fastest",
            "fails": [],
        }
    if not judged:
        return {"meets-all": [], "proposed": None, "proposed-as": None, "fails": []}
    safest = min(judged, key=_safety)
    return {
        "meets-all": [],
        "proposed": safest["arm"],
        "proposed-as": "safest",
        "fails": list(safest["fails"]),
    }


def judge_async(
    pairs: Pairs,
    arm: str,
    refs: tuple[str, str | None],
    crit: str,
    idle_shares: Sequence[float],
) -> dict[str, Any]:
    """Issue 33's goals for an asynchronous arm (``refs``: B1's arm and the proposed
    synchronous default, None when there is none)."""
    vb = paired(pairs, arm, refs[0], crit)
    worst = max(idle_shares) if idle_shares else None
    median = float(np.median(idle_shares)) if idle_shares else None
    idle = _check(
        "idle",
        worst is not None and worst <= ASYNC_IDLE_SHARE_MAX + EPS,
        "not recorded"
        if worst is None or median is None
        else f"median {_pct(median)}, worst {_pct(worst)} over {len(idle_shares)} runs",
        f"≤ {ASYNC_IDLE_SHARE_MAX:.0%} in every run",
        worst,
    )
    if refs[1] is None:
        vs_default = _check("time-default", False, "no synchronous default", "", None)
    else:
        vd = paired(pairs, arm, refs[1], crit)
        what = f"no later than `{refs[1]}`"
        need = ASYNC_NO_LATER_THAN_DEFAULT_SHARE
        vs_default = _share("time-default", vd.no_later, vd.n, need, what)
    checks = [
        _misses("a", vb),
        idle,
        _sooner("time-b1", vb.median_time, ASYNC_TIME_VS_B1_MAX, f"≤ {ASYNC_TIME_VS_B1_MAX:g}×"),
        vs_default,
        _share(
            "energy-b1",
            vb.no_more_energy,
            vb.n,
            ASYNC_NO_MORE_ENERGY_THAN_B1_SHARE,
            "no more energy than B1",
        ),
    ]
    return {
        "arm": arm,
        "against-default": refs[1],
        "checks": checks,
        "meets-all": all(c["pass"] for c in checks),
        "fails": [c["check"] for c in checks if not c["pass"]],
        "median-time-vs-b1": vb.median_time,
        "idle-share-median": median,
        "idle-share-worst": worst,
    }


# --------------------------------------------------------------------------- the study


def _reference(arms: Sequence[Mapping[str, Any]], name: str, method: str) -> str | None:
    """The arm called ``name`` if there is one, else the first arm of ``method`` that runs
    synchronous FedAvg rounds without a round plan and has no other setting: ``balance =
    "off"`` and ``aggregation = "fedavg"`` allowed, and its aggregation as it resolves
    (``aggregation = "auto"``, the default, makes ``power-aware`` asynchronous, so a plain
    power-aware arm is not ``off``)."""
    if any(a["name"] == name for a in arms):
        return name
    plain = {("balance", "off"), ("aggregation", "fedavg")}
    for a in arms:
        rest = {k: v for k, v in a.items() if k not in ("name", "method")}
        if a.get("method") != method or set(rest.items()) - plain:
            continue
        if RunSettings.from_config({"method": method, **rest}).aggregation == "fedavg":
            return str(a["name"])
    return None


def async_arms(
    arms: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]]
) -> list[str]:
    """The arms whose runs aggregate with ``fedbuff`` (by the file, or by their records: the
    cell's settings, or what the run resolved ``aggregation = "auto"`` to, its summary's)."""
    found = {str(a["name"]) for a in arms if a.get("aggregation") == "fedbuff"}
    for rec in records:
        ran = (
            rec.get("settings", {}).get("aggregation"),
            rec.get("summary", {}).get("aggregation"),
        )
        if "fedbuff" in ran:
            found.update(str(arm) for _, arm in rec.get("uses", []))
    return [str(a["name"]) for a in arms if a["name"] in found]


def idle_shares(records: Sequence[Mapping[str, Any]], arm: str) -> list[float]:
    """The ``idle-share`` of every run of ``arm`` that recorded one."""
    out = []
    for rec in records:
        share = rec.get("summary", {}).get("idle-share")
        if share is not None and any(a == arm for _, a in rec.get("uses", [])):
            out.append(float(share))
    return out


def coverage(pairs: Pairs, config: Mapping[str, Any], arms: Sequence[str]) -> dict[str, Any]:
    """The pairs and runs the study planned and those it holds."""
    seeds = config.get("seeds", 0)
    n_seeds = len(seeds) if isinstance(seeds, list) else int(seeds)
    fleets = len(config.get("fleets", [])) + len(config.get("generated-fleets", []))
    planned = fleets * n_seeds
    runs = sum(arm in pairs[k] for k in pairs for arm in arms)
    missing = {arm: [list(k) for k in sorted(pairs) if arm not in pairs[k]] for arm in arms}
    return {
        "planned-pairs": planned,
        "pairs": len(pairs),
        "pairs-with-every-arm": sum(all(a in pairs[k] for a in arms) for k in pairs),
        "planned-runs": planned * len(arms),
        "runs": runs,
        "complete": runs >= planned * len(arms),
        "no-run": {arm: keys for arm, keys in missing.items() if keys},
    }


def verdict(pairs: Pairs, study: Mapping[str, Any], crit: str) -> dict[str, Any]:
    """The four criteria for every power-aware arm under ``crit``, the proposal among them
    all, the synchronous default (the same choice among the synchronous arms) and issue 33's
    goals for the asynchronous arms against it."""
    refs = (study["b1"], study["off"])
    judged = [judge_arm(pairs, arm, refs, crit) for arm in study["power-aware"]]
    sync = [j for j in judged if j["arm"] not in study["async"]]
    out = {"arms": judged, **choose(judged), "synchronous": choose(sync)["proposed"]}
    out["proposed-is-async"] = out["proposed"] in study["async"]
    out["async"] = [
        judge_async(pairs, arm, (refs[0], out["synchronous"]), crit, study["idle-shares"][arm])
        for arm in study["async"]
    ]
    return out


def choose_default(
    pairs: Pairs, records: Sequence[Mapping[str, Any]], config: Mapping[str, Any]
) -> dict[str, Any]:
    """``summary.json``'s ``choosing-the-default``: the thresholds, the study's coverage and
    the verdict under each criterion of ``VERDICT_CRITERIA`` (None when the study lacks B1's
    or ``off``'s arm)."""
    arms = list(config["arms"])
    names = [str(a["name"]) for a in arms]
    b1, off = _reference(arms, "b1", "b1"), _reference(arms, "off", "power-aware")
    asyn = async_arms(arms, records)
    study = {
        "b1": b1,
        "off": off,
        "power-aware": [str(a["name"]) for a in arms if a.get("method") == "power-aware"],
        "async": asyn,
        "idle-shares": {arm: idle_shares(records, arm) for arm in asyn},
    }
    out: dict[str, Any] = {
        "thresholds": THRESHOLDS,
        "b1": b1,
        "off": off,
        "async-arms": asyn,
        "coverage": coverage(pairs, config, names),
        "criteria": {},
    }
    if b1 is not None and off is not None:
        out["criteria"] = {crit: verdict(pairs, study, crit) for crit in VERDICT_CRITERIA}
    return out


# --------------------------------------------------------------------------- the report


def _cell(c: Mapping[str, Any]) -> str:
    return f"{'pass' if c['pass'] else '**fail**'}: {c['measured']}"


def _short(fails: Sequence[str]) -> str:
    return ", ".join(CHECK_SHORT[f] for f in fails)


def _named(arms: Sequence[str]) -> str:
    return ", ".join(f"`{a}`" for a in arms) if arms else "none"


def _fails(v: Mapping[str, Any], arm: str) -> str:
    """The checks ``arm`` fails, with what was measured against what was needed."""
    judged = next(j for j in v["arms"] + v["async"] if j["arm"] == arm)
    return "; ".join(
        f"{c['title']}: {c['measured']}, needs {c['needs']}"
        for c in judged["checks"]
        if not c["pass"]
    )


def proposal_text(v: Mapping[str, Any]) -> str:
    """One sentence: the arms that meet all four criteria and the proposed default."""
    if v["proposed"] is None:
        return "No power-aware arm to propose."
    judged = next(j for j in v["arms"] if j["arm"] == v["proposed"])
    speed = median_text(judged["median-time-vs-b1"])
    if v["proposed-as"] == "fastest":
        aim = judged["median-time-vs-b1"] <= 1.0 / SOONER_THAN_B1_AIM_X + EPS
        how = ' (asynchronous: aggregation = "fedbuff")' if v.get("proposed-is-async") else ""
        sync = (
            f" The synchronous default it is compared with: `{v['synchronous']}`."
            if v.get("proposed-is-async") and v.get("synchronous")
            else ""
        )
        return (
            f"meet all four: {_named(v['meets-all'])}. Proposed default: `{v['proposed']}`"
            f"{how}, the fastest of them by median time against B1 ({speed}; the "
            f"{SOONER_THAN_B1_AIM_X:g}× aim {'met' if aim else 'not met'}).{sync}"
        )
    return (
        f"no arm meets all four. Kept: `{v['proposed']}`, the safest (fewest misses of "
        "targets B1 reaches, then fewest pairs later than `off`, then the lowest median "
        f"time ratio against B1: {speed}); it fails {_fails(v, v['proposed'])}."
    )


def _coverage_line(doc: Doc, cov: Mapping[str, Any]) -> None:
    if cov["complete"]:
        doc.add(f"The study is complete: {cov['pairs']} pairs, {cov['runs']} runs.", "")
        return
    doc.add(
        f"**Provisional:** the study is incomplete; this verdict stands on {cov['pairs']} of "
        f"{cov['planned-pairs']} planned pairs ({cov['pairs-with-every-arm']} with a run of "
        f"every arm; {cov['runs']} of {cov['planned-runs']} planned runs).",
        "",
    )


def _arms_table(doc: Doc, v: Mapping[str, Any]) -> None:
    if not v["arms"]:
        return
    header = ["arm"]
    for c in v["arms"][0]["checks"]:
        header.append(f"{c['title']} (needs {c['needs']})")
    doc.table([*header, "meets all"])
    for j in v["arms"]:
        verdict_cell = "**yes**" if j["meets-all"] else "no: " + _short(j["fails"])
        doc.row(f"`{j['arm']}`", *(_cell(c) for c in j["checks"]), verdict_cell)
    doc.add("")


def _pairs_text(keys: Sequence[Sequence[Any]]) -> str:
    return ", ".join(f"{f} seed {seed}" for f, seed in keys)


def _left_out_lines(doc: Doc, v: Mapping[str, Any], cov: Mapping[str, Any]) -> None:
    """The pairs left out of the criteria: no run of an arm, or neither reaches."""
    lines = [
        f"- no run of `{arm}` in {len(keys)} of the {cov['pairs']} pairs ({_pairs_text(keys)}): "
        "left out of its comparisons"
        for arm, keys in cov["no-run"].items()
    ]
    for j in v["arms"]:
        for ref, keys in j["neither-reaches"].items():
            if keys and ref != j["arm"]:
                lines.append(
                    f"- `{j['arm']}` and `{ref}`: neither reaches the target in {len(keys)} "
                    f"pair(s) ({_pairs_text(keys)}): left out"
                )
    doc.add("Pairs left out of the criteria:" if lines else "No pair left out.", "")
    if lines:
        doc.add(*lines, "")


def _async_section(doc: Doc, v: Mapping[str, Any]) -> None:
    if not v["async"]:
        doc.add("No asynchronous (`fedbuff`) arm in this study: issue 33's goals not assessed.", "")
        return
    doc.add(
        "Asynchronous (`fedbuff`) arms, issue 33's goals (their rounds are model versions; "
        f"the synchronous default compared with: `{v['synchronous']}`):",
        "",
    )
    header = [f"{c['title']} (needs {c['needs']})" for c in v["async"][0]["checks"]]
    doc.table(["arm", *header, "meets all"])
    for j in v["async"]:
        verdict_cell = "**yes**" if j["meets-all"] else "no: " + _short(j["fails"])
        doc.row(f"`{j['arm']}`", *(_cell(c) for c in j["checks"]), verdict_cell)
    doc.add("")
    for j in v["async"]:
        if j["meets-all"] and j["arm"] in v["meets-all"]:
            doc.add(
                f"`{j['arm']}` meets issue 33's goals and issue 32's four criteria "
                f"(median time ÷ B1 {median_text(j['median-time-vs-b1'])}).",
                "",
            )


def section(doc: Doc, choice: Mapping[str, Any], titles: Mapping[str, str]) -> None:
    """``## Choosing the default`` from ``choose_default``'s figures (``titles``: each
    criterion's title)."""
    doc.add("## Choosing the default", "")
    if not choice["criteria"]:
        doc.add(
            "Not judged: the study needs a B1 arm and an `off` arm (power-aware, no "
            "balance) to compare with.",
            "",
        )
        return
    _coverage_line(doc, choice["coverage"])
    main, other = VERDICT_CRITERIA
    v = choice["criteria"][main]
    doc.add(
        f"Criterion: {titles[main]} (the runs' own rule). Issue 32's four criteria for every "
        "power-aware arm, over the pairs where the arm and the reference (B1 or `off`) both "
        "have a run and at least one reaches the target: where only the reference reaches "
        "it, the arm counts as later and using more; where only the arm does, the "
        "reference's time and energy to the end of its run stand in (the ratio is an upper "
        "bound); a pair where neither does is left out (listed below).",
        "",
    )
    _arms_table(doc, v)
    _left_out_lines(doc, v, choice["coverage"])
    cov = choice["coverage"]
    provisional = (
        ""
        if cov["complete"]
        else f", provisional: {cov['pairs']} of {cov['planned-pairs']} planned pairs"
    )
    doc.add(f"**Verdict** ({titles[main]}{provisional}): {proposal_text(v)}", "")
    doc.add(f"Under the {titles[other]}: {proposal_text(choice['criteria'][other])}", "")
    _async_section(doc, v)
