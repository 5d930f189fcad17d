"""The pictures of finished runs (``simulations.report_plots``): valid PNG files, and the
bars and curves on them are the records' numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simulations import report_plots
from simulations.report import (
    RunRecords,
    fedbuff_node_names,
    fedbuff_segments,
    load_run,
    progress,
    timeline_segments,
)
from simulations.report_plots import (
    PROGRESS,
    TIMELINE,
    draw_pictures,
    draw_timeline,
    progress_figure,
    timeline_figure,
)
from tests.simulations.test_report import fabricated_run, fedbuff_run

PNG = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG file, from its header (IHDR); asserts it is one."""
    data = path.read_bytes()
    assert data[:8] == PNG and data[12:16] == b"IHDR", f"{path} is not a PNG file"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _runs(tmp_path: Path) -> list[RunRecords]:
    return [
        load_run(fabricated_run(tmp_path / "pa")),
        load_run(fabricated_run(tmp_path / "b1", method="b1", slower=1.3)),
    ]


def _drawn_bars(ax: Any) -> list[tuple[int, float, float]]:
    """(row, start, length) of every bar in a timeline panel."""
    out = []
    for coll in ax.collections:
        for p in coll.get_paths():
            xs, ys = p.vertices[:, 0], p.vertices[:, 1]
            if xs.max() > xs.min():  # a bar (the deadline marks are vertical lines)
                row = round(float(ys.mean()))
                out.append((row, round(float(xs.min()), 9), round(float(xs.max() - xs.min()), 9)))
    return sorted(out)


def test_timeline_panels_draw_the_records_bars(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    fig = timeline_figure(runs)
    panels = [ax for ax in fig.axes if ax.get_yticks().size]
    assert len(panels) == 2
    for ax, run in zip(panels, runs, strict=True):
        rows = [t.get_text() for t in ax.get_yticklabels()]
        assert rows == ["nano-4.5w", "tx2nx-7w", "orin-free"]
        expected = sorted(
            (rows.index(s.node), round(s.start_s, 9), round(s.duration_s, 9))
            for s in timeline_segments(run.rounds, run.nodes)
        )
        assert _drawn_bars(ax) == expected
        assert ax.get_title(loc="left").startswith(f"{run.method}: 3 rounds")
    # the panels share one device-time axis, long enough for the slower run
    assert panels[0].get_xlim() == panels[1].get_xlim()
    assert panels[0].get_xlim()[1] >= runs[1].summary["sim-time-s"]
    assert panels[1].get_xlabel() == "device time (s), rounds one after another"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:3] == ["profiling", "training", "idle: waiting for the round's slowest node"]
    assert "round plan's deadline" in legend and "no update this round" in legend


def _marks(ax: Any, colour: str) -> list[float]:
    """The x of every full-height vertical mark of ``colour`` in a timeline panel."""
    from matplotlib.colors import to_rgba

    out = []
    for coll in ax.collections:
        colours = [tuple(c) for c in coll.get_edgecolor()]  # one: every path's
        for i, p in enumerate(coll.get_paths()):
            xs, ys = p.vertices[:, 0], p.vertices[:, 1]
            full = xs.max() == xs.min() and ys.max() - ys.min() > 1
            if full and colours and colours[i % len(colours)] == to_rgba(colour):
                out.append(float(xs[0]))
    return sorted(out)


@pytest.mark.usefixtures("flower_task_identity")
def test_a_fedbuff_timeline_draws_each_nodes_works_and_its_versions(tmp_path: Path) -> None:
    run = load_run(fedbuff_run(tmp_path / "run", drop=[12], target=0.3))
    fig = timeline_figure([run])
    (ax,) = [ax for ax in fig.axes if ax.get_yticks().size]
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows == fedbuff_node_names(run)
    expected = sorted(
        (rows.index(s.node), round(s.start_s, 9), round(s.duration_s, 9))
        for s in fedbuff_segments(run)
    )
    assert _drawn_bars(ax) == expected
    # a dotted mark at each version's virtual time, a green one where the target was reached
    assert _marks(ax, "black") == pytest.approx([r["sim-time-s"] for r in run.rounds])
    s = run.summary
    assert s["round-to-target"] == 3
    assert _marks(ax, "tab:green") == pytest.approx([s["sim-time-to-target-s"]])
    title = ax.get_title(loc="left")
    assert title.startswith(f"power-aware: fedbuff, {s['versions']} versions from ")
    assert "rounds" not in title and "rounds" in ax.get_xlabel()  # "…, no rounds"
    assert ax.get_xlabel().startswith("virtual device time (s): every node trains on its own")
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [
        "profiling",
        "training",
        "idle: waiting for the shared profiling step",
        "dropped: no update from this work on",
        "running at the stop (no record)",
        "global version made",
        "target reached",
    ]
    written = draw_pictures([run], tmp_path / "out")
    assert [p.name for p in written] == [TIMELINE, PROGRESS]
    assert png_size(written[0])[0] > 500
    progress_axes = progress_figure([run]).axes
    assert progress_axes[0].get_xlabel() == "virtual device time (s)"
    assert "each global version" in progress_axes[0].figure.get_suptitle()


def test_progress_draws_every_run_and_the_target(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    fig = progress_figure(runs, ["first", "second"])
    ax_t, ax_e = fig.axes
    for ax, attr in ((ax_t, "time_s"), (ax_e, "energy_j")):
        curves = {ln.get_label(): ln for ln in ax.lines if not ln.get_label().startswith("_")}
        assert list(curves) == ["first", "second"]
        for run, label in zip(runs, ["first", "second"], strict=True):
            expected = progress(run, label)
            assert list(curves[label].get_xdata()) == pytest.approx(getattr(expected, attr))
            assert list(curves[label].get_ydata()) == pytest.approx(expected.accuracy)
        # the target line, and one star: only the first run reached it
        flat = [ln for ln in ax.lines if list(ln.get_ydata()) == [0.7, 0.7]]
        assert len(flat) == 1
        stars = [ln for ln in ax.lines if ln.get_marker() == "*"]
        first = progress(runs[0])
        assert first.target_index is not None
        at = getattr(first, attr)[first.target_index]
        assert [(s.get_xdata()[0], s.get_ydata()[0]) for s in stars] == [
            (pytest.approx(at), pytest.approx(0.74))
        ]
    # runs in rounds: the axes and title say rounds, as they always have
    assert ax_t.get_xlabel() == "device time (s)"
    assert fig.get_suptitle() == "accuracy after each round (★: target reached)"


def test_pictures_are_png_files(tmp_path: Path) -> None:
    runs = _runs(tmp_path)
    one = draw_pictures(runs[:1], tmp_path / "one")
    two = draw_pictures(runs, tmp_path / "two")
    assert [p.name for p in one] == [p.name for p in two] == [TIMELINE, PROGRESS]
    (w1, h1), (w2, h2) = png_size(one[0]), png_size(two[0])
    assert w1 == w2 and h2 > h1 * 1.5  # a panel per run
    assert png_size(one[1]) == png_size(two[1])  # the runs share the progress panels


def test_no_timeline_for_a_fleet_too_large_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _runs(tmp_path)
    monkeypatch.setattr(report_plots, "MAX_TIMELINE_NODES", 2)  # the runs have 3 nodes
    assert draw_timeline(runs, tmp_path / TIMELINE) is None
    assert not (tmp_path / TIMELINE).exists()
    assert [p.name for p in draw_pictures(runs, tmp_path / "out")] == [PROGRESS]
