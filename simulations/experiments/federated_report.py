"""Tables, plots and report.md of a federated study, from its saved records only.

``powerfl experiment report DIR`` re-renders everything here without running anything.
Every time and energy is read from the runs' records as the recorder
(``fl_server.results``) wrote them, never accounted again here; all device time and energy
come from the digital twins:

* *time to target*: simulated wall-clock time (sum of round times; a synchronous round lasts
  as long as its slowest node, profiling included) until the global model reaches
  ``target-accuracy``: the first round whose mean accuracy over ``target-window`` rounds
  reaches it (the runs' ``round-to-target``, at which they stop; 1: the first round at it);
* *fleet energy to target*: the energy of every node up to that round, idle waiting
  included (a board that waits for the round is switched on), whatever the runs'
  ``idle-accounting``: its parts as recorded, *training + profiling* (``busy``) and *idle
  waiting* (each node's idle power × the time it waits for the slowest node), are shown
  apart and summed here;
* *straggler share*: the share of rounds in which a node was the slowest (it set the round
  time) and the share of the simulated time those rounds took; *wait*: round time − the
  node's own time, per round.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from simulations.experiments import report_kit as kit
from simulations.experiments.config import METHOD_LABELS, STUDY_METHODS
from simulations.experiments.federated_config import (
    CELL_VERSION,
    NAME,
    SCENARIO_TITLES,
    SCENARIO_VARIANTS,
    SCENARIOS,
)
from simulations.experiments.federated_metrics import (
    QUANTS,
    Rec,
    aggregate,
    by_use,
    mean_nodes,
    node_names,
    paired,
    time_factors,
)
from simulations.experiments.federated_plots import write_figures
from simulations.experiments.records import write_json
from simulations.experiments.report_kit import NA, Doc, Output

# --------------------------------------------------------------------------- report.md


def load_records(output: Output) -> list[Rec]:
    """The cell records of the current version (older cells are run again, not mixed in)."""
    return [
        r
        for r in output.records("cells")
        if r.get("study") == NAME and r.get("cell-version") == CELL_VERSION
    ]


def _summary_json(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json: the groups' means, then every seed's numbers apart."""

    def without_seeds(g: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in g.items() if k != "per-seed"}

    scenarios = summary["scenarios"].items()
    return {
        "methods": {m: without_seeds(g) for m, g in summary["methods"].items()},
        "scenarios": {s: {v: without_seeds(g) for v, g in sc.items()} for s, sc in scenarios},
        "per-seed": {
            "methods": {m: g["per-seed"] for m, g in summary["methods"].items()},
            "scenarios": {s: {v: g["per-seed"] for v, g in sc.items()} for s, sc in scenarios},
        },
    }


def render(out: Path) -> Path:
    """Write summary.json, plots (PNG + CSV) and report.md into ``out``; return report.md."""
    output = kit.load_output(out)
    records = load_records(output)
    config = output.config
    summary = aggregate(records)
    write_json(out / "summary.json", _summary_json(summary))
    figures = write_figures(out, float(config["target-accuracy"]), summary, records)
    doc = Doc()
    kit.experiment_head(doc, output, "federated study", f"{len(records)} run records")
    _run_notes(doc, output, records)
    methods = [m for m in STUDY_METHODS if m in summary["methods"]]
    if methods:
        _methods_section(doc, summary, methods, records, config)
    for scenario in SCENARIOS:
        if scenario in summary["scenarios"] and scenario != "balance":
            _scenario_section(doc, summary, scenario, records, config)
    if "balance" in summary["scenarios"]:
        from simulations.experiments import balance_report  # the balance study's section

        balance_report.section(doc, summary, records, config)
    kit.figures_section(doc, figures)
    kit.settings_section(doc, config)
    doc.add(
        "Run settings of every cell (the overrides of `[tool.flwr.app.config]`) are in each "
        "record under `records/cells/` (`settings`), with the full per-round and per-node "
        "rows of its run; each run's log is under `runs/`.",
        "",
    )
    kit.provenance_section(doc, output.manifest)
    return doc.write(out / "report.md")


def _run_notes(doc: Doc, output: Output, records: list[Rec]) -> None:
    manifest, config = output.manifest, output.config
    counts = manifest.get("counts", {})
    walls = ", ".join(
        f"{r['method']}/seed {r['seed']} {r['host-wall-s']:.0f} s"
        for r in sorted(records, key=lambda r: (r["seed"], r["method"]))
    )
    doc.add(
        f"Wall time of the last `run`: {kit.fmt(manifest.get('wall-s'), digits=0)} s on "
        f"{manifest.get('host', {}).get('cpus', '?')} CPU core(s) "
        f"(cells run {counts.get('cells-done', '?')}, reused {counts.get('cells-reused', '?')}, "
        f"failed {counts.get('cells-failed', '?')}); host wall time per run: {walls}.",
        "",
    )
    failures = counts.get("failures", [])
    if failures:
        doc.add(*(f"- failed: {f}" for f in failures), "")
    alpha = config["partitioning"] == "dirichlet"
    doc.add(
        f"Each run: fleet `{config['fleet']}` in Flower's simulation engine, model "
        f"`{config['model']}`, {config['partitioning']} partitioning"
        + (f" (Dirichlet α = {config['dirichlet-alpha']:g})" if alpha else "")
        + f", {config['num-rounds']} rounds, {config['local-epochs']} local epochs per round, "
        f"target accuracy {float(config['target-accuracy']):g} on the server's test split "
        f"(reached at the first round whose mean accuracy over "
        f"{int(config.get('target-window', 1))} round(s) reaches it), "
        f"seeds {', '.join(str(s) for s in range(int(config['seeds'])))} (the same data split "
        "and initial weights for every method of a seed). Time is simulated device time: a "
        "round lasts as long as its slowest node (training + profiling); energy is the twins' "
        "sensor energy. Mean ± std over seeds; a quantity 'to target' is averaged over the "
        "seeds that reached the target (shown as reached/seeds).",
        "",
    )


TO_TARGET_COLUMNS = (
    "method",
    "reached",
    "rounds",
    "sim time s",
    "energy J",
    "train + profile J",
    "idle wait J",
    "profiling share",
    "time ÷ ours",
    "energy ÷ ours",
    "rounds 2…target s",
    "round time after round 1 s",
)
WHOLE_RUN_COLUMNS = (
    "method",
    "final accuracy",
    "sim time s",
    "energy J",
    "train + profile J",
    "idle wait J",
    "node-rounds over cap",
    "node-rounds failed",
)
NODE_COLUMNS = (
    "node",
    "device",
    "cap",
    "(b, f MHz) × rounds",
    "train s",
    "profile s",
    "energy J",
    "wait s",
    "idle wait J",
    "slowest",
    "peak max W",
    "rounds peak > cap",
    "time over cap s",
    "rounds ok",
)


def _reached(g: dict[str, Any], q: str, digits: int | None = None) -> str:
    if g["seeds-reached"] == 0:
        return "not reached"
    txt = kit.fmt(g[f"{q}-mean"], g[f"{q}-std"], digits)
    if g["seeds-reached"] < g["seeds"]:
        txt += f" ({g['seeds-reached']}/{g['seeds']})"
    return txt


def _mean(g: dict[str, Any], q: str, digits: int | None = None) -> str:
    return kit.fmt(g[f"{q}-mean"], g[f"{q}-std"], digits)


def _methods_section(
    doc: Doc,
    summary: dict[str, Any],
    methods: list[str],
    records: list[Rec],
    config: dict[str, Any],
) -> None:
    doc.add("## Methods on the same fleet, data and seeds", "")
    _to_target_table(doc, summary["methods"], methods)
    _versus_b1_section(doc, summary["methods"])
    doc.add(
        f"**Whole run** (a run stops at the round that reaches the target, else after "
        f"{config['num-rounds']} rounds)",
        "",
    )
    doc.table(WHOLE_RUN_COLUMNS)
    for m in methods:
        g = summary["methods"][m]
        doc.row(
            METHOD_LABELS.get(m, m),
            _mean(g, "final-accuracy", 3),
            _mean(g, "sim-time-s"),
            _mean(g, "energy-j"),
            _mean(g, "busy-energy-j"),
            _mean(g, "idle-energy-j"),
            kit.fmt(g["over-cap-node-rounds-mean"], digits=1),
            kit.fmt(g["node-rounds-failed-mean"], digits=1),
        )
    doc.add("")
    doc.add(
        "A node-round is *over cap* when a sample of the twin's power sensor during local "
        "training exceeded the node's cap (sensor noise included; *time over cap* is how long "
        "the samples stayed above it); *failed* when the node returned no update (reasons "
        "below).",
        "",
    )
    _straggler_section(doc, records, methods)
    _node_errors(doc, records, methods)


def _to_target_table(doc: Doc, ms: dict[str, Any], methods: list[str]) -> None:
    doc.add(
        "**To the target accuracy** (energy: idle waiting included = training + profiling "
        "+ idle waiting)",
        "",
    )
    doc.table(TO_TARGET_COLUMNS)
    ours = ms.get("power-aware")

    def versus_ours(g: dict[str, Any], q: str) -> str:
        if ours is None or not ours[f"{q}-mean"] or g[f"{q}-mean"] is None:
            return NA
        return f"{g[f'{q}-mean'] / ours[f'{q}-mean']:.2f}×"

    for m in methods:
        g = ms[m]
        doc.row(
            METHOD_LABELS.get(m, m),
            f"{g['seeds-reached']}/{g['seeds']}",
            _reached(g, "round-to-target", 1),
            _reached(g, "time-to-target-s"),
            _reached(g, "energy-to-target-j"),
            _reached(g, "busy-energy-to-target-j"),
            _reached(g, "idle-energy-to-target-j"),
            f"{kit.fmt(100 * (g['profile-share-mean'] or 0.0), digits=1)}%",
            versus_ours(g, "time-to-target-s"),
            versus_ours(g, "energy-to-target-j"),
            _reached(g, "time-to-target-after-1-s"),
            _mean(g, "round-time-after-1-s"),
        )
    doc.add("")
    doc.add(
        "Ratios are of the means over the seeds that reached the target (> 1× means ours "
        "is faster / uses less). Profiling share = profiling ÷ (profiling + training) device "
        "time summed over nodes and all rounds. *Rounds 2…target*: the time to target "
        "without the first round, in which every profiling node profiles (the one-time cost "
        "that a longer training amortises); *round time after round 1*: mean over the later "
        "rounds.",
        "",
    )


#: Goals of the fleet-shared profiling work for ours against B1, per seed.
FREE_PROFILING_GOAL = 0.10  # time to target within 10% of the same run with free profiling


def _versus_b1_section(doc: Doc, ms: dict[str, Any]) -> None:
    """Seed by seed: does ours reach the target no later than B1 with no more energy, both
    counting profiling, and how close is it to free profiling; where its lead comes from."""
    ours, b1 = ms.get("power-aware"), ms.get("b1")
    if ours is None or b1 is None:
        return
    doc.add("### Ours against B1, seed by seed (profiling counted)", "")
    doc.table(
        (
            "seed",
            "ours s",
            "B1 s",
            "ours J",
            "B1 J",
            "no later, no more J",
            "ours free-profiling s",
            "profiling overhead",
            "B1 ÷ ours time",
            "= rounds ×",
            "per round ×",
            "profiling",
        )
    )
    for seed in sorted(set(ours["per-seed"]) & set(b1["per-seed"])):
        o, b = ours["per-seed"][seed], b1["per-seed"][seed]
        f = time_factors(o, b)
        t_o, t_b = o["time-to-target-s"], b["time-to-target-s"]
        e_o, e_b = o["energy-to-target-j"], b["energy-to-target-j"]
        if t_o is None:
            verdict = "no (ours missed)"
        elif t_b is None:
            verdict = "yes (B1 missed)"
        else:
            verdict = "yes" if t_o <= t_b and e_o <= e_b else "no"
        free = o["time-to-target-free-profiling-s"]
        overhead = f"{100 * (t_o / free - 1):.1f}%" if t_o and free else NA
        doc.row(
            str(seed),
            kit.fmt(t_o),
            kit.fmt(t_b),
            kit.fmt(e_o),
            kit.fmt(e_b),
            verdict,
            kit.fmt(free),
            overhead,
            *(
                (
                    f"{f['ratio']:.2f}×",
                    f"{f['rounds']:.2f}",
                    f"{f['per-round']:.2f}",
                    f"{f['profiling']:.2f}",
                )
                if f
                else (NA, NA, NA, NA)
            ),
        )
    doc.add("")
    doc.add(
        "Energy is to the target, idle waiting included (training + profiling alone in the "
        "table above). "
        f"*Profiling overhead*: ours' time to target over the same rounds with profiling "
        f"counted as free, less 1 (goal ≤ {100 * FREE_PROFILING_GOAL:.0f}%). The ratio B1 ÷ "
        "ours splits exactly into *rounds* (B1's rounds to target ÷ ours: the batch size's "
        "effect on learning), *per round* (B1's mean round time ÷ ours with free profiling: "
        "the speed of the chosen (b, f); a synchronous round lasts as long as its slowest "
        "node) and *profiling* (ours with free profiling ÷ ours as run).",
        "",
    )


def _straggler_section(doc: Doc, records: list[Rec], methods: list[str]) -> None:
    doc.add("### Straggler share (whole run, mean over seeds)", "")
    doc.add(
        "Per node: % of rounds it was the slowest (set the round time) / % of simulated "
        "time those rounds took / mean wait for the slowest node per round (s).",
        "",
    )
    names = node_names([r for m in methods for r in by_use(records, "methods", m)])
    tables = {m: mean_nodes(by_use(records, "methods", m)) for m in methods}
    doc.table(["node", "device", *(METHOD_LABELS.get(m, m) for m in methods)])
    for name in names:
        dev = next((t[name]["device"] for t in tables.values() if name in t), "?")
        cells = []
        for m in methods:
            t = tables[m].get(name)
            cells.append(
                NA
                if t is None
                else f"{100 * t['slowest-share']:.0f}% / {100 * t['slowest-time-share']:.0f}% / "
                f"{kit.fmt(t['mean-wait-s'])}"
            )
        doc.row(name, dev, *cells)
    doc.add("")
    doc.add("### Per-device time and energy breakdown (whole run, mean over seeds)", "")
    for m in methods:
        doc.add(f"**{METHOD_LABELS.get(m, m)}**", "")
        _node_table(doc, tables[m], names)


def _node_errors(doc: Doc, records: list[Rec], methods: list[str]) -> None:
    errors = sorted(
        {
            f"{r['method']} seed {r['seed']}: {n['node-name']} round {n['server-round']}: "
            f"{str(n.get('error', ''))[:200]}"
            for m in methods
            for r in by_use(records, "methods", m)
            for n in r["nodes"]
            if not n.get("ok")
        }
    )
    if errors:
        doc.add("Node-rounds without an update:", "")
        doc.add(*(f"- {e}" for e in errors[:30]))
        if len(errors) > 30:
            doc.add(f"- … and {len(errors) - 30} more (see the records)")
        doc.add("")


def _node_table(doc: Doc, table: dict[str, dict[str, Any]], names: list[str]) -> None:
    doc.table(NODE_COLUMNS)
    for name in names:
        t = table.get(name)
        if t is None:
            continue
        choices = ", ".join(f"{k} ×{v}" for k, v in t["choices"].most_common(3))
        if len(t["choices"]) > 3:
            choices += ", …"
        doc.row(
            name,
            t["device"],
            kit.cap_span(t["caps"]),
            choices or NA,
            *(kit.fmt(t[q]) for q in ("train-time-s", "profile-time-s", "energy-j", "wait-s")),
            kit.fmt(t["idle-energy-j"]),
            f"{100 * (t['slowest-share'] or 0.0):.0f}%",
            kit.fmt(t["peak-power-w"], digits=2),
            kit.fmt(t["over-cap-rounds"], digits=1),
            kit.fmt(t["time-over-cap-s"]),
            f"{kit.fmt(t['rounds-ok'], digits=1)}/{kit.fmt(t['rounds'], digits=1)}",
        )
    doc.add("")


# --------------------------------------------------------------------------- scenarios


def _scenario_intro(scenario: str, config: dict[str, Any]) -> str:
    method = config.get("scenario-method", "power-aware")
    if scenario == "balance-energy":
        return (
            f'`{method}` on fleet `{config["fleet"]}` with `balance = "off"` and `balance = '
            f'"energy"` (deadline-margin {config["deadline-margin"]}); everything else equal.'
        )
    if scenario == "varying-cap":
        return (
            f"`{method}` on `{config['varying-cap-fleet']}` (nodes with a `p-max-schedule`) "
            "and on the same fleet with each schedule replaced by its minimum cap "
            "(`fleets/*-fixed-at-minimum.toml` in this folder)."
        )
    return (
        f"`{method}` on `{config['drift-fleet']}` (twins that slow down / draw more from "
        f"some round) with `drift-check-every = {config['drift-check-every']}` "
        f"(threshold {config['drift-threshold']}) and with the check off."
    )


#: Quantities reported to the target (averaged over the seeds that reached it): the first
#: six of ``QUANTS``.
TO_TARGET = frozenset(QUANTS[:6])
#: Columns of every scenario's table, then those of some scenarios.
SCENARIO_COLUMNS: list[tuple[str, str | None]] = [
    ("reached", None),
    ("rounds to target", "round-to-target"),
    ("time to target s", "time-to-target-s"),
    ("energy to target J", "energy-to-target-j"),
    ("train + profile to target J", "busy-energy-to-target-j"),
    ("idle wait to target J", "idle-energy-to-target-j"),
    ("final acc.", "final-accuracy"),
    ("run: time s", "sim-time-s"),
    ("run: energy J", "energy-j"),
    ("run: idle wait J", "idle-energy-j"),
    ("profiling energy J", "profile-energy-j"),
    ("round time after round 1 s", "round-time-after-1-s"),
    ("energy / round after round 1 J", "energy-per-round-after-1-j"),
    ("idle wait / round after round 1 J", "idle-per-round-after-1-j"),
    ("critical node / round after round 1 J", "critical-per-round-after-1-j"),
    ("slack nodes / round after round 1 J", "slack-per-round-after-1-j"),
]
ENERGY_MODE_COLUMNS: list[tuple[str, str | None]] = [
    ("LUT-predicted saving / round J", "saved-per-round-after-1-j"),
    ("LUT-predicted saving to target J", "saved-to-target-j"),
    ("LUT-predicted saving, run J", "energy-saved-j"),
    ("deadline misses", "deadline-misses"),
]
CAP_COLUMNS: list[tuple[str, str | None]] = [
    ("node-rounds failed", "node-rounds-failed"),
    ("node-rounds over cap", "over-cap-node-rounds"),
    ("time over cap s", "time-over-cap-s"),
]
#: Paired by seed: the other variant against the reference.
PAIRED = (
    ("time-to-target-s", "time to target"),
    ("energy-to-target-j", "energy to target incl. idle waiting"),
    ("busy-energy-to-target-j", "training + profiling energy to target"),
    ("profile-energy-j", "profiling energy"),
    ("round-time-after-1-s", "round time after round 1"),
    ("busy-per-round-after-1-j", "measured training energy per round after round 1"),
    ("energy-per-round-after-1-j", "training + idle waiting energy per round after round 1"),
    ("sim-time-s", "time, whole run"),
    ("energy-j", "energy incl. idle waiting, whole run"),
)


def _scenario_columns(scenario: str) -> list[tuple[str, str | None]]:
    cols = list(SCENARIO_COLUMNS)
    if scenario == "balance-energy":
        cols += ENERGY_MODE_COLUMNS
    if scenario in ("varying-cap", "drift"):
        cols += CAP_COLUMNS
    if scenario == "drift":
        cols += [("re-profiles", "drift-reprofiles")]
    return cols


def _scenario_cell(g: dict[str, Any], q: str | None) -> str:
    if q is None:
        return f"{g['seeds-reached']}/{g['seeds']}"
    if q in TO_TARGET:
        return _reached(g, q, 1 if q == "round-to-target" else None)
    return _mean(g, q, 3 if q == "final-accuracy" else None)


def _paired_lines(summary: dict[str, Any], scenario: str, ref: str, other: str) -> list[str]:
    rows = []
    for q, label in PAIRED:
        pairs = paired(summary, scenario, ref, other, q)
        if not pairs:
            rows.append(f"- {label}: no seed where both variants have it")
            continue
        diffs = [100.0 * (b - a) / a for _, a, b in pairs if a]
        per_seed = "; ".join(f"seed {s}: {a:.3g} → {b:.3g}" for s, a, b in pairs)
        rows.append(
            f"- {label}, {other} vs {ref}: {statistics.fmean(diffs):+.1f}% "
            f"(per seed {', '.join(f'{d:+.1f}%' for d in diffs)}; {per_seed})"
        )
    return rows


def _energy_mode_notes(summary: dict[str, Any], ref: str, other: str) -> list[str]:
    noise = summary["scenarios"]["balance-energy"].get(ref, {}).get("time-to-target-s-std")
    r2t = paired(summary, "balance-energy", ref, other, "round-to-target")
    same = sum(1 for _, a, b in r2t if a == b)
    return [
        f"- rounds to target identical in {same}/{len(r2t)} seed(s) (the energy mode "
        "keeps every node's b*, so the learning dynamics are the same); seed-to-seed std of the "
        f"reference's time to target: {kit.fmt(noise)} s",
        "- *saved* is what the LUTs of the nodes with slack predict they save against "
        "running their fastest cell (the nodes report it); the *measured* effect is the "
        "difference in the twins' sensor energy per round above. The energy mode measures "
        "no cell of its own: it chooses among the cells of b*'s row the LUT holds.",
    ]


def _scenario_section(
    doc: Doc, summary: dict[str, Any], scenario: str, records: list[Rec], config: dict[str, Any]
) -> None:
    sc = summary["scenarios"][scenario]
    variants = [v for v in SCENARIO_VARIANTS[scenario] if v in sc]
    ref, other = SCENARIO_VARIANTS[scenario]
    doc.add(f"## {SCENARIO_TITLES[scenario]}", "", _scenario_intro(scenario, config), "")
    cols = _scenario_columns(scenario)
    doc.table(["variant", *(c for c, _ in cols)])
    for v in variants:
        doc.row(v, *(_scenario_cell(sc[v], q) for _, q in cols))
    doc.add("")
    doc.add("Paired by seed (same data and initial weights):", "")
    doc.add(*_paired_lines(summary, scenario, ref, other))
    if scenario == "balance-energy":
        doc.add(*_energy_mode_notes(summary, ref, other))
    doc.add("")
    if scenario in ("varying-cap", "drift"):
        for v in variants:
            recs = by_use(records, scenario, v)
            doc.add(f"**{v}: per node (whole run, mean over seeds)**", "")
            _node_table(doc, mean_nodes(recs), node_names(recs))
