"""The pictures of finished runs: ``timeline.png`` (who trains, profiles and waits in
each round) and ``progress.png`` (accuracy against device time and fleet energy).

Drawn with matplotlib's ``Figure`` on its file-only Agg canvas (no display, no pyplot
state), as the run's ``split.png`` is; the numbers come from ``simulations.report``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulations.report import (
    KINDS,
    RunRecords,
    node_names,
    progress,
    round_spans,
    timeline_segments,
)

TIMELINE, PROGRESS, COMPARISON = "timeline.png", "progress.png", "comparison.png"
#: Above this many nodes in one run, one row per node stops being readable: no timeline.
MAX_TIMELINE_NODES = 64
#: Bar colours per ``KINDS`` entry.
KIND_COLOURS = {
    "profiling": "tab:orange",
    "training": "tab:blue",
    "idle": "#d9d9d9",
    "failed": "tab:red",
}
_DPI = 120


def _figure(width_in: float, height_in: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI)
    return path


def draw_timeline(
    runs: Sequence[RunRecords], path: str | Path, labels: Sequence[str] | None = None
) -> Path | None:
    """``timeline_figure`` written to ``path``; None (nothing written) when a run has more
    than ``MAX_TIMELINE_NODES`` nodes."""
    if not runs or max(len(node_names(r.nodes)) for r in runs) > MAX_TIMELINE_NODES:
        return None
    return _save(timeline_figure(runs, labels), Path(path))


def timeline_figure(runs: Sequence[RunRecords], labels: Sequence[str] | None = None) -> Any:
    """One panel per run (its ``labels`` entry, default: its method), one row per node,
    all panels on one device-time axis: each round's profiling, training and idle waiting
    per node, a white gap between rounds and a dashed mark where the round plan put the
    round's deadline."""
    names = [node_names(r.nodes) for r in runs]
    labels = [r.method for r in runs] if labels is None else list(labels)
    heights = [max(len(n), 1) * 0.32 + 0.9 for n in names]
    fig = _figure(11.0, sum(heights) + 0.9)
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
    seen: dict[str, Any] = {}
    for ax, run, rows, label in zip(axes, runs, names, labels, strict=True):
        row_of = {name: i for i, name in enumerate(rows)}
        bars: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for seg in timeline_segments(run.rounds, run.nodes):
            bars.setdefault((seg.node, seg.kind), []).append((seg.start_s, seg.duration_s))
        for (node, kind), xs in bars.items():
            handle = ax.broken_barh(
                xs,
                (row_of[node] - 0.38, 0.76),
                facecolors=KIND_COLOURS[kind],
                hatch="//" if kind == "failed" else None,
                linewidth=0,
            )
            seen.setdefault(kind, handle)
        spans = round_spans(run.rounds, run.nodes)
        for span in spans:
            if span.start_s > 0:  # a white gap between rounds, through the bars
                ax.axvline(span.start_s, color="white", linewidth=1.0, zorder=3)
            if span.deadline_at_s is not None:
                seen["deadline"] = ax.vlines(
                    span.deadline_at_s,
                    -0.5,
                    len(rows) - 0.5,
                    colors="black",
                    linestyles="--",
                    linewidth=0.9,
                    zorder=4,
                )
        ax.set_yticks(range(len(rows)), rows)
        ax.set_ylim(len(rows) - 0.5, -0.5)  # the first node on top
        s = run.summary
        ax.set_title(
            f"{label}: {s['rounds']} rounds, {float(s['sim-time-s']):.1f} s device time, "
            f"profiling {100 * float(s['profile-share']):.1f}% of device time",
            loc="left",
            fontsize=10,
        )
    axes[-1].set_xlabel("device time (s), rounds one after another")
    axes[-1].set_xlim(left=0.0)
    order = [k for k in (*KINDS, "deadline") if k in seen]
    fig.legend(
        [seen[k] for k in order],
        [_LEGEND[k] for k in order],
        loc="outside upper center",
        ncols=len(order),
        frameon=False,
    )
    return fig


_LEGEND = {
    "profiling": "profiling",
    "training": "training",
    "idle": "idle: waiting for the round's slowest node",
    "failed": "no update this round",
    "deadline": "round plan's deadline",
}


def draw_progress(
    runs: Sequence[RunRecords], path: str | Path, labels: Sequence[str] | None = None
) -> Path:
    """``progress_figure`` written to ``path``."""
    return _save(progress_figure(runs, labels), Path(path))


def progress_figure(runs: Sequence[RunRecords], labels: Sequence[str] | None = None) -> Any:
    """Accuracy after each round against the fleet's device time (left) and its energy,
    idle waiting included (right), one curve per run (its ``labels`` entry, default: its
    method); the target accuracy as a dashed line, and a star where each run reached it."""
    labels = [r.method for r in runs] if labels is None else list(labels)
    curves = [progress(r, label) for r, label in zip(runs, labels, strict=True)]
    fig = _figure(11.0, 4.4)
    ax_t, ax_e = fig.subplots(1, 2, sharey=True)
    for i, c in enumerate(curves):
        colour = f"C{i % 10}"
        for ax, xs in ((ax_t, c.time_s), (ax_e, c.energy_j)):
            ax.plot(xs, c.accuracy, marker="o", markersize=3, color=colour, label=c.label)
            if c.target_index is not None:
                at = c.target_index
                ax.plot([xs[at]], [c.accuracy[at]], marker="*", markersize=13, color=colour,
                        markeredgecolor="black", linestyle="none")  # fmt: skip
    for target in sorted({c.target_accuracy for c in curves}):
        for ax in (ax_t, ax_e):
            ax.axhline(target, color="0.3", linestyle="--", linewidth=0.9)
        ax_t.annotate(
            f"target {target:g}",
            (0.0, target),
            xytext=(2, 3),
            textcoords="offset points",
            fontsize=8,
            color="0.3",
        )
    ax_t.set_xlabel("device time (s)")
    ax_e.set_xlabel("fleet energy, idle waiting included (J)")
    ax_t.set_ylabel("test accuracy")
    for ax in (ax_t, ax_e):
        ax.set_xlim(left=0.0)
        ax.grid(alpha=0.3)
    ax_e.legend(loc="lower right", fontsize=9)
    fig.suptitle("accuracy after each round (★: target reached)", fontsize=10)
    return fig


def draw_pictures(
    runs: Sequence[RunRecords], folder: str | Path, labels: Sequence[str] | None = None
) -> list[Path]:
    """``timeline.png`` (unless a run's fleet is too large for one) and ``progress.png``
    of ``runs`` in ``folder``; returns the paths written."""
    folder = Path(folder)
    written = [draw_timeline(runs, folder / TIMELINE, labels)]
    written.append(draw_progress(runs, folder / PROGRESS, labels))
    return [p for p in written if p is not None]
