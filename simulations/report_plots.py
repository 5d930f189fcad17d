"""The pictures of finished runs: ``timeline.png`` (who trains, profiles and waits in
each round; in a ``fedbuff`` run, each node's works on its own virtual clock and the times
its global versions were made) and ``progress.png`` (accuracy against device time and fleet
energy).

Drawn with matplotlib's ``Figure`` on its file-only Agg canvas (no display, no pyplot
state), as the run's ``split.png`` is; the numbers come from ``simulations.report``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulations.report import (
    RunRecords,
    progress,
    round_spans,
    run_node_names,
    run_segments,
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
    "running": "#aec7e8",
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
    if not runs or max(len(run_node_names(r)) for r in runs) > MAX_TIMELINE_NODES:
        return None
    return _save(timeline_figure(runs, labels), Path(path))


def timeline_figure(runs: Sequence[RunRecords], labels: Sequence[str] | None = None) -> Any:
    """One panel per run (its ``labels`` entry, default: its method), one row per node,
    all panels on one device-time axis: each round's profiling, training and idle waiting
    per node, a white gap between rounds and a dashed mark where the round plan put the
    round's deadline. A ``fedbuff`` run's panel has no rounds: each node's works one after
    another on its own virtual clock (``fedbuff_segments``), a dotted mark at the time of
    each global version and a solid one at the version that reached the target."""
    names = [run_node_names(r) for r in runs]
    labels = [r.method for r in runs] if labels is None else list(labels)
    heights = [max(len(n), 1) * 0.32 + 0.9 for n in names]
    fig = _figure(11.0, sum(heights) + 0.9)
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0]
    seen: dict[str, Any] = {}  # legend text -> a handle drawn with it
    for ax, run, rows, label in zip(axes, runs, names, labels, strict=True):
        legend = _FEDBUFF_LEGEND if run.is_fedbuff else _LEGEND
        row_of = {name: i for i, name in enumerate(rows)}
        bars: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for seg in run_segments(run):
            bars.setdefault((seg.node, seg.kind), []).append((seg.start_s, seg.duration_s))
        for (node, kind), xs in bars.items():
            handle = ax.broken_barh(
                xs,
                (row_of[node] - 0.38, 0.76),
                facecolors=KIND_COLOURS[kind],
                hatch={"failed": "//", "running": ".."}.get(kind),
                linewidth=0,
            )
            seen.setdefault(legend[kind], handle)
        if run.is_fedbuff:
            _mark_versions(ax, run, row_of, seen)
        else:
            _mark_rounds(ax, run, len(rows), seen)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_ylim(len(rows) - 0.5, -0.5)  # the first node on top
        ax.set_title(_panel_title(run, label), loc="left", fontsize=10)
    axes[-1].set_xlabel(_TIME_AXIS[_schedule(runs)])
    axes[-1].set_xlim(left=0.0)
    order = list(dict.fromkeys(t for d in (_LEGEND, _FEDBUFF_LEGEND) for t in d.values()))
    order = [t for t in order if t in seen]
    fig.legend(
        [seen[t] for t in order],
        order,
        loc="outside upper center",
        ncols=min(len(order), 4) if _schedule(runs) != "rounds" else len(order),
        frameon=False,
    )
    return fig


def _mark_rounds(ax: Any, run: RunRecords, rows: int, seen: dict[str, Any]) -> None:
    """A white gap between rounds, through the bars, and the round plan's deadlines."""
    for span in round_spans(run.rounds, run.nodes):
        if span.start_s > 0:
            ax.axvline(span.start_s, color="white", linewidth=1.0, zorder=3)
        if span.deadline_at_s is not None:
            seen[_LEGEND["deadline"]] = ax.vlines(
                span.deadline_at_s,
                -0.5,
                rows - 0.5,
                colors="black",
                linestyles="--",
                linewidth=0.9,
                zorder=4,
            )


def _mark_versions(ax: Any, run: RunRecords, rows_of: dict[str, int], seen: dict[str, Any]) -> None:
    """A white gap at the start of each work, a dotted mark at the virtual time each global
    version was made, a solid one at the version that reached the target
    (``sim-time-to-target-s``)."""
    for update in run.updates:  # a white gap between a node's works, through its bar
        row = rows_of[str(update["node"])]
        ax.vlines(float(update["start-s"]), row - 0.38, row + 0.38, colors="white", zorder=3)
    times = [float(r["sim-time-s"]) for r in run.rounds]
    if times:
        seen[_FEDBUFF_LEGEND["version"]] = ax.vlines(
            times, -0.5, len(rows_of) - 0.5, colors="black", linestyles=":", linewidth=0.7, zorder=4
        )
    reached_s = run.summary["sim-time-to-target-s"]
    if reached_s is not None:
        seen[_FEDBUFF_LEGEND["target"]] = ax.vlines(
            float(reached_s), -0.5, len(rows_of) - 0.5, colors="tab:green", linewidth=1.6, zorder=5
        )


def _panel_title(run: RunRecords, label: str) -> str:
    s = run.summary
    profiling = f"profiling {100 * float(s['profile-share']):.1f}% of device time"
    if not run.is_fedbuff:
        return (
            f"{label}: {s['rounds']} rounds, {float(s['sim-time-s']):.1f} s device time, "
            + profiling
        )
    idle = s.get("idle-share")
    return (
        f"{label}: fedbuff, {s['versions']} versions from {s['updates-applied']} updates, "
        f"{float(s['sim-time-s']):.1f} s virtual device time, "
        + ("" if idle is None else f"idle {100 * float(idle):.1f}% of the fleet's time, ")
        + profiling
    )


def _schedule(runs: Sequence[RunRecords]) -> str:
    """``rounds``, ``fedbuff``, or ``both`` among ``runs``."""
    kinds = {r.is_fedbuff for r in runs}
    return "both" if len(kinds) > 1 else "fedbuff" if True in kinds else "rounds"


_TIME_AXIS = {
    "rounds": "device time (s), rounds one after another",
    "fedbuff": "virtual device time (s): every node trains on its own clock, no rounds",
    "both": "device time (s): rounds one after another; fedbuff: every node on its own clock",
}
#: ``progress.png``'s time and energy axes and title, by ``_schedule``
_PROGRESS_LABELS = {
    "rounds": (
        "device time (s)",
        "fleet energy, idle waiting included (J)",
        "accuracy after each round (★: target reached)",
    ),
    "fedbuff": (
        "virtual device time (s)",
        "fleet energy, idle time included (J)",
        "accuracy after each global version (fedbuff: no rounds; ★: target reached)",
    ),
    "both": (
        "device time (s); fedbuff: virtual",
        "fleet energy, idle included (J)",
        "accuracy after each round or, fedbuff, each global version (★: target reached)",
    ),
}
_LEGEND = {
    "profiling": "profiling",
    "training": "training",
    "idle": "idle: waiting for the round's slowest node",
    "failed": "no update this round",
    "deadline": "round plan's deadline",
}
_FEDBUFF_LEGEND = {
    "profiling": "profiling",
    "training": "training",
    "idle": "idle: waiting for the shared profiling step",
    "failed": "dropped: no update from this work on",
    "running": "running at the stop (no record)",
    "version": "global version made",
    "target": "target reached",
}


def draw_progress(
    runs: Sequence[RunRecords], path: str | Path, labels: Sequence[str] | None = None
) -> Path:
    """``progress_figure`` written to ``path``."""
    return _save(progress_figure(runs, labels), Path(path))


def progress_figure(runs: Sequence[RunRecords], labels: Sequence[str] | None = None) -> Any:
    """Accuracy after each round (a ``fedbuff`` run: each global version) against the fleet's
    device time (left) and its energy, idle waiting included (right), one curve per run
    (its ``labels`` entry, default: its method); the target accuracy as a dashed line, and
    a star where each run reached it."""
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
    schedule = _schedule(runs)
    ax_t.set_xlabel(_PROGRESS_LABELS[schedule][0])
    ax_e.set_xlabel(_PROGRESS_LABELS[schedule][1])
    ax_t.set_ylabel("test accuracy")
    for ax in (ax_t, ax_e):
        ax.set_xlim(left=0.0)
        ax.grid(alpha=0.3)
    ax_e.legend(loc="lower right", fontsize=9)
    fig.suptitle(_PROGRESS_LABELS[schedule][2], fontsize=10)
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
