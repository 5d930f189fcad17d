"""The figures of a federated study's report, each a PNG with its data beside it as CSV:
accuracy against simulated time per method and per scenario (one line per seed), and the
fleet energy per method (training + profiling and idle waiting apart)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simulations.experiments import report_kit as kit
from simulations.experiments.config import METHOD_LABELS, STUDY_METHODS
from simulations.experiments.federated_config import SCENARIO_TITLES, SCENARIO_VARIANTS, SCENARIOS
from simulations.experiments.federated_metrics import Rec, by_use


def _curve(rec: Rec) -> list[tuple[int, float, float, float, float]]:
    """(round, sim time s, accuracy, fleet busy energy J, fleet idle energy J), round 0
    first."""
    s = rec["summary"]
    pts = [(0, 0.0, float(s.get("initial-accuracy") or 0.0), 0.0, 0.0)]
    for r in rec["rounds"]:
        pts.append(
            (
                int(r["server-round"]),
                float(r["sim-time-s"]),
                float(r["accuracy"]),
                float(r["fleet-busy-energy-j"]),
                float(r["fleet-idle-energy-j"]),
            )
        )
    return pts


def _fig_accuracy(
    out: Path, series: list[tuple[str, Rec]], name: str, title: str, target: float
) -> str:
    plt = kit.pyplot()
    kit.write_csv(
        out / f"{name}.csv",
        [
            "series",
            "seed",
            "round",
            "sim_time_s",
            "accuracy",
            "fleet_busy_energy_j",
            "fleet_idle_energy_j",
        ],
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
    kit.save_figure(fig, out / f"{name}.png")
    return name


def _fig_energy(out: Path, summary: dict[str, Any], methods: list[str]) -> str:
    plt = kit.pyplot()
    name = "fig-energy-to-target"
    cols = (
        "busy-energy-to-target-j-mean",
        "busy-energy-to-target-j-std",
        "idle-energy-to-target-j-mean",
        "idle-energy-to-target-j-std",
        "busy-energy-j-mean",
        "idle-energy-j-mean",
    )
    rows = []
    for m in methods:
        g = summary["methods"][m]
        rows.append([m, g["seeds-reached"], g["seeds"], *(g[c] for c in cols)])
    kit.write_csv(
        out / f"{name}.csv",
        [
            "method",
            "seeds_reached",
            "seeds",
            "train_profile_energy_to_target_j_mean",
            "train_profile_energy_to_target_j_std",
            "idle_energy_to_target_j_mean",
            "idle_energy_to_target_j_std",
            "train_profile_energy_all_rounds_j_mean",
            "idle_energy_all_rounds_j_mean",
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
    kit.save_figure(fig, out / f"{name}.png")
    return name


def write_figures(
    out: Path, target: float, summary: dict[str, Any], records: list[Rec]
) -> list[tuple[str, str]]:
    """Every figure of the report, written under ``out``: each one's name and caption."""
    methods = [m for m in STUDY_METHODS if m in summary["methods"]]
    figures: list[tuple[str, str]] = []
    if methods:
        series = [
            (METHOD_LABELS.get(m, m), rec) for m in methods for rec in by_use(records, "methods", m)
        ]
        title = "Accuracy against simulated time per method (one line per seed)"
        name = _fig_accuracy(out, series, "fig-accuracy-vs-time", title, target)
        figures.append((name, "accuracy against simulated time per method"))
        figures.append((_fig_energy(out, summary, methods), "fleet energy per method"))
    for scenario in SCENARIOS:
        if scenario not in summary["scenarios"] or scenario == "balance":
            continue
        series = [
            (f"{scenario}: {v}", rec)
            for v in SCENARIO_VARIANTS[scenario]
            for rec in by_use(records, scenario, v)
        ]
        title = SCENARIO_TITLES[scenario]
        figures.append((_fig_accuracy(out, series, f"fig-{scenario}", title, target), title))
    return figures
