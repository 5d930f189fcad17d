"""``powerfl report RUN [RUN …]``: the pictures and a short table of finished runs, from
their JSON records only; and the pictures ``powerfl simulate`` draws at its end.

Each run folder stays as the run left it: ``report`` writes into ``--out``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_client.preflight import check_writable_dir
from fl_client.settings import SettingsError
from simulations.report import FLEET, TABLE_COLUMNS, UPDATES, RunRecords, load_run, table_row
from simulations.report_plots import (
    COMPARISON,
    MAX_TIMELINE_NODES,
    PROGRESS,
    TIMELINE,
    draw_pictures,
    draw_progress,
)

#: Where ``powerfl report`` writes when ``--out`` is not given (relative to the current
#: directory).
DEFAULT_OUT = "report"


def add_report_command(sub: Any) -> None:
    """Register ``report`` on the ``powerfl`` sub-parsers."""
    p = sub.add_parser(
        "report",
        help="draw and compare finished runs (timeline, progress, a table) from their records",
        description="Read finished run folders (what `powerfl simulate` writes: "
        "runs/<time>-<method>; only their summary.json, rounds.jsonl and nodes.jsonl, and a "
        f"fedbuff run's {UPDATES} and {FLEET}) and draw each run's {TIMELINE} (per node and round: "
        "training, profiling, idle waiting and the round plan's deadline; a fedbuff run: "
        "each node's works on its own virtual clock and when each global version was made) "
        f"and {PROGRESS} (accuracy against device time and "
        f"fleet energy) into OUT/<run folder name>/; for two runs or more also "
        f"OUT/{COMPARISON} (every run's progress on one figure, labelled by run folder "
        "name). Prints a table: rounds, time and energy (idle waiting included) to the "
        "target, and the share of device time spent profiling. Runs from other machines "
        "compare the same way: copy their folders here.",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="a finished run folder")
    p.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"folder for the pictures (default: {DEFAULT_OUT} in the current directory); "
        "the run folders are only read",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    runs = load_runs(args.runs)
    out = check_writable_dir(args.out, "--out")
    try:
        return report(runs, out)
    except KeyboardInterrupt:  # a large run's pictures take a while: stop without a trace
        print(
            f"powerfl report: interrupted; the pictures drawn so far are in {out}",
            file=sys.stderr,
        )
        return 130


def report(runs: Sequence[RunRecords], out: Path) -> int:
    """Each run's pictures in ``out/<label>/``, the comparison and the table."""
    labels = run_labels(runs)
    print(f"report of {len(runs)} run{'s' if len(runs) > 1 else ''} → {out}")
    for run, label in zip(runs, labels, strict=True):
        paths = draw_pictures([run], out / label)
        print(f"  {label}: {', '.join(str(p) for p in paths)}{_left_out(paths)}")
    if len(runs) > 1:
        print(f"  comparison: {draw_progress(runs, out / COMPARISON, labels)}")
    print_table(runs, labels)
    return 0


def load_runs(folders: Sequence[str | Path]) -> list[RunRecords]:
    """Every folder read before anything is drawn; one given twice is refused."""
    seen: dict[Path, str] = {}
    for folder in folders:
        path = Path(folder).expanduser().resolve()
        if path in seen:
            raise SettingsError(f"RUN: {folder} names the run folder {seen[path]} again")
        seen[path] = str(folder)
    return [load_run(folder) for folder in folders]


def run_labels(runs: Sequence[RunRecords]) -> list[str]:
    """Each run's label: its folder's name, or ``parent/name`` where two runs' folders
    have the same name (runs copied from two machines)."""
    names = [r.name for r in runs]
    return [f"{r.folder.parent.name}/{r.name}" if names.count(r.name) > 1 else r.name for r in runs]


def _left_out(paths: Sequence[Path]) -> str:
    if any(p.name == TIMELINE for p in paths):
        return ""
    return f" ({TIMELINE} left out: more than {MAX_TIMELINE_NODES} nodes)"


def print_table(runs: Sequence[RunRecords], labels: Sequence[str]) -> None:
    """Rounds, time and energy to the target and profiling share, one line per run."""
    from rich.table import Table

    from fl_server.results import make_console

    table = Table(
        title="Runs; energy counts idle waiting; profiling: its share of device time"
        + ("; fedbuff: rounds are global versions" if any(r.is_fedbuff for r in runs) else ""),
        title_justify="left",
    )
    for col in TABLE_COLUMNS:
        left = col in ("run", "method")  # names are never cut; headers wrap instead
        table.add_column(col, justify="left" if left else "right", no_wrap=left)
    for run, label in zip(runs, labels, strict=True):
        table.add_row(label, *table_row(run)[1:])
    make_console().print(table)


# ------------------------------------------------------------------ at the end of simulate


def draw_simulate_pictures(run_dirs: Sequence[str | Path]) -> list[Path]:
    """``timeline.png`` (one panel per method) and ``progress.png`` (every method) of the
    runs one ``powerfl simulate`` made, drawn once into the first run's folder and copied
    into each other's, so every method's folder shows the whole comparison. Returns the
    first folder's paths."""
    runs = [load_run(folder) for folder in run_dirs]
    paths = draw_pictures(runs, runs[0].folder)
    for run in runs[1:]:
        for path in paths:
            shutil.copyfile(path, run.folder / path.name)
    return paths


def print_simulate_pictures(summaries: Sequence[dict[str, Any]]) -> None:
    """Draw the pictures of a finished ``simulate`` and print their paths; a picture that
    cannot be drawn costs a warning, never the run (its records are written)."""
    run_dirs = [s["run-dir"] for s in summaries if s.get("run-dir")]
    if not run_dirs:
        return
    try:
        paths = draw_simulate_pictures(run_dirs)
    except Exception as err:  # the run is done and recorded: say so, keep its exit status
        print(
            f"powerfl: warning: the run's pictures were not drawn ({type(err).__name__}: "
            f"{err}); `powerfl report RUN` draws them from the run's records",
            file=sys.stderr,
        )
        return
    for path in paths:
        print(f"  {path.stem:<12} {path}")
    if len(run_dirs) > 1:
        print(f"  (each run folder above holds {' and '.join(p.name for p in paths)}, every "
              "method in each)")  # fmt: skip
    left_out = _left_out(paths)
    if left_out:
        print(f"  {left_out.strip(' ()')}")
    sys.stdout.flush()
