"""The run docs/simulation.md shows is the one whose records are committed in
``docs/default-run/``: its printed figures, its ``powerfl report`` output and the README's
pictures all come from those records, so a new run means new records, and the docs follow.
"""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from fl_server.async_records import AsyncRecorder
from fl_server.results import RunRecorder
from fl_server.target import Target
from simulations.cli import main, print_comparison
from simulations.report import RunRecords, load_run
from simulations.report_cli import draw_simulate_pictures
from tests.simulations.test_report_plots import png_size

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "simulation.md"
RECORDS = REPO / "docs" / "default-run"
IMAGES = REPO / "docs" / "img"
#: Lines the run prints from its records (its summary and the comparison): each one the
#: page shows must be what the records print now, and so must the lines that follow it up
#: to the next ``NOT_DERIVED`` line (what a long line wraps onto, the rest of a table).
DERIVED = (
    "Per node",
    "┃",
    "│",
    "profiling took",
    "fleet energy ",
    "energy per round",
    "using ",
    "Methods on",
    "power-aware vs",
    "fedbuff: ",
)
#: The lines that end a block of ``DERIVED`` lines: what the run prints from elsewhere than
#: its records (a run folder's absolute path, the next run's start, the wall time).
NOT_DERIVED = ("results: ", "powerfl method=", "done in ", "…")
ROUND = re.compile(
    r"^round +(\d+) +accuracy ([\d.]+) +round +([\d.]+) s +sim time +([\d.]+) s +"
    r"fleet energy +([\d.]+) J +nodes (\d+)/(\d+)"
)


def _runs() -> list[RunRecords]:
    """The default run's methods in the order it ran them (power-aware, then b1)."""
    runs = [load_run(p) for p in sorted(RECORDS.iterdir()) if p.is_dir()]
    order = {"power-aware": 0, "b1": 1}
    return sorted(runs, key=lambda r: order.get(r.method, 2))


def _text_block_after(marker: str) -> list[str]:
    """The lines of the first ```text block after the line ``marker``."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index(marker)
    begin = lines.index("```text", start) + 1
    return lines[begin : lines.index("```", begin)]


def _printed(runs: list[RunRecords], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the run printed from its records at its end: each method's summary, by the
    recorder its run had (``fl_server.server_app.make_recorder``: a ``fedbuff`` run's is
    ``AsyncRecorder``, which adds its versions' line), then the comparison (120 columns, as
    on a log)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    console = Console(file=buf, width=120, highlight=False)
    monkeypatch.setattr("fl_server.results.make_console", lambda: console)
    for run in runs:
        s = run.summary
        kind = AsyncRecorder if run.is_fedbuff else RunRecorder
        recorder = kind(
            run.folder,
            method=run.method,
            target=Target(s["target-accuracy"], s["target-window"]),
            console=console,
        )
        recorder.print_summary(s)
    print_comparison([r.summary for r in runs])
    return [line.rstrip() for line in buf.getvalue().splitlines()]


def test_the_run_shown_is_the_recorded_one(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _runs()
    assert [r.method for r in runs] == ["power-aware", "b1"]
    assert [r.is_fedbuff for r in runs] == [True, False]  # aggregation = "auto"
    shown = _text_block_after("## What a run prints")
    printed = set(_printed(runs, monkeypatch))
    by_method = {r.method: r for r in runs}
    method, checked_rounds, checked_lines, derived = "", 0, 0, False
    for line in shown:
        head = re.match(r"powerfl method=(\S+)", line)
        if head:
            method = head.group(1)
        if line.startswith(NOT_DERIVED):
            derived = False
        if head:
            continue
        m = ROUND.match(line)
        if m:
            rnd = int(m.group(1))
            r = by_method[method].rounds[rnd - 1]
            assert r["server-round"] == rnd, line
            assert m.group(2) == f"{r['accuracy']:.3f}", line
            assert m.group(3) == f"{r['round-time-s']:.1f}", line
            assert m.group(4) == f"{r['sim-time-s']:.1f}", line
            assert m.group(5) == f"{r['fleet-energy-j']:.1f}", line
            assert int(m.group(6)) == r["nodes-ok"], line
            checked_rounds += 1
        elif line.startswith("round   0  accuracy"):
            assert f"{by_method[method].summary['initial-accuracy']:.3f}" in line
        elif (
            derived
            or line.startswith(DERIVED)
            or re.match(rf"({'|'.join(by_method)}): accuracy", line)
        ):
            assert line in printed, f"the page shows what its records do not print: {line!r}"
            derived, checked_lines = True, checked_lines + 1
    assert checked_rounds >= 8 and checked_lines >= 30


def test_the_report_shown_is_what_report_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    runs = _runs()
    assert main(["report", *(str(r.folder) for r in runs), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    table = [line.rstrip() for line in out if line[:1] in "┏┃┡│└R"]
    shown = [line for line in _text_block_after("## Looking at finished runs") if line[:1] in
             "┏┃┡│└R"]  # fmt: skip
    assert shown == table and len(table) >= 6


def test_the_readme_pictures_are_drawn_from_the_records(tmp_path: Path) -> None:
    folders = []
    for run in _runs():
        shutil.copytree(run.folder, tmp_path / run.name)
        folders.append(tmp_path / run.name)
    drawn = draw_simulate_pictures(folders)
    assert [p.name for p in drawn] == ["timeline.png", "progress.png"]
    for path in drawn:
        assert png_size(IMAGES / path.name) == png_size(path)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "](docs/img/timeline.png)" in readme and "](docs/img/progress.png)" in readme
