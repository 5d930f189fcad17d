"""What every study's report shares: numbers as text, mean ± std, caps, CSV, output folders,
plots and the markdown sections around the study's own tables."""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_client.contract import Cap
from simulations.experiments.records import load_all

#: A value that is not there.
NA = "—"


class ReportError(ValueError):
    """The folder is not an experiment output (the message names what is missing)."""


# --------------------------------------------------------------------------- numbers


def mean_std(xs: Iterable[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation of the values that are not None; the std of one
    value is 0, and (None, None) when there is none."""
    vals = [float(x) for x in xs if x is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def fmt(m: float | None, s: float | None = None, digits: int | None = None) -> str:
    """``mean ± std``; ``digits`` None: 3 significant digits of the mean set the decimals."""
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return NA
    if digits is None:
        mag = math.floor(math.log10(abs(m))) if m else 0
        digits = max(0, 2 - mag)
    if s is None:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def ratio(x: float | None) -> str:
    """``1.23×``."""
    return NA if x is None else f"{x:.2f}×"


def ratio_of(a: float | None, b: float | None) -> float | None:
    """a / b, None where either is missing or b is 0."""
    return a / b if a is not None and b else None


# --------------------------------------------------------------------------- caps


def cap_of(value: object) -> Cap:
    """A cap from a setting, a record or a label: a number of W, ``"none"``, None,
    ``"4.5 W"`` or ``"4.5W"`` (older records)."""
    if isinstance(value, str):
        value = value.strip().removesuffix("W").strip()
    return Cap.parse(value)


def cap_label(value: object) -> str:
    """``"4.5 W"``, or ``"none"`` for no cap: the cap in tables, plots and summaries."""
    return cap_of(value).label


def cap_watts(value: object) -> float | None:
    """The cap in W as the selector takes it: None for no cap."""
    cap = cap_of(value)
    return cap.watts if cap.capped else None


def cap_span(values: Iterable[object]) -> str:
    """The caps a node had over a run: ``"4.5 W"``, ``"none"``, ``"4.5–7 W"``,
    ``"4.5–none"``; ``"?"`` when none was seen."""
    caps = sorted({cap_of(v) for v in values})
    if not caps:
        return "?"
    lo, hi = caps[0], caps[-1]
    return lo.label if lo == hi else f"{lo.setting}–{hi.label}"


# --------------------------------------------------------------------------- files


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A CSV file with a header row (None as an empty cell)."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Lay out, write and close a figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


@dataclass(frozen=True)
class Output:
    """An output folder of ``powerfl experiment run``: its manifest and its records."""

    folder: Path
    manifest: dict[str, Any]

    @property
    def config(self) -> dict[str, Any]:
        """The study's settings as resolved at the run's scale."""
        return dict(self.manifest["config"])

    @property
    def study(self) -> str:
        return str(self.manifest.get("study", ""))

    def records(self, kind: str) -> list[dict[str, Any]]:
        """Every record under ``records/<kind>/`` (sorted by path)."""
        return load_all(self.folder / "records" / kind)


def load_output(out: Path) -> Output:
    """The output folder ``out``; a file, or a folder without a manifest, is a
    ``ReportError``."""
    if out.is_file():
        raise ReportError(
            f"{out} is a file, not a folder; a report takes the study's output folder (the "
            "--out of `powerfl experiment run`, which holds manifest.json)"
        )
    manifest_path = out / "manifest.json"
    if not manifest_path.is_file():
        raise ReportError(
            f"{out}: no manifest.json; expected the output folder of `powerfl experiment run`"
        )
    return Output(out, json.loads(manifest_path.read_text(encoding="utf-8")))


# --------------------------------------------------------------------------- markdown


class Doc:
    """A markdown document, built line by line."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def row(self, *cells: str) -> None:
        self.add("| " + " | ".join(cells) + " |")

    def table(self, header: Sequence[str], rows: Iterable[Sequence[str]] = ()) -> None:
        """A header, its rule and ``rows`` (more rows may follow with ``row``)."""
        self.row(*header)
        self.add("|" + "---|" * len(header))
        for r in rows:
            self.row(*r)

    def write(self, path: Path, *, final_newline: bool = False) -> Path:
        path.write_text("\n".join(self.lines) + ("\n" if final_newline else ""), encoding="utf-8")
        return path


def experiment_head(doc: Doc, output: Output, study_title: str, records: str) -> None:
    """Title, description, status and the command of a run."""
    config, manifest = output.config, output.manifest
    doc.add(f"# Experiment `{config['name']}` — {study_title} ({config['scale']} scale)", "")
    if config.get("description"):
        doc.add(config["description"], "")
    status = "complete" if manifest.get("complete") else "INCOMPLETE (some cells missing)"
    doc.add(f"Status: {status}; {records}. Command:", "")
    doc.add("```", manifest.get("command", "?"), "```", "")


def figures_section(doc: Doc, figures: Sequence[tuple[str, str]]) -> None:
    """``## Plots``: each (file stem, kind) with its CSV and the image inline."""
    doc.add("## Plots", "")
    for name, kind in figures:
        doc.add(f"- {kind}: `{name}.png` (data: `{name}.csv`)", "")
        doc.add(f"  ![{name}]({name}.png)", "")


def settings_section(doc: Doc, config: dict[str, Any]) -> None:
    """Every resolved setting of the study as a table."""
    doc.add("## Settings (resolved from the experiment file at this scale)", "")
    doc.table(("key", "value"), ((f"`{k}`", f"`{json.dumps(v)}`") for k, v in config.items()))
    doc.add("")


def provenance_section(doc: Doc, manifest: dict[str, Any]) -> None:
    """The data note, the experiment file and the software versions of the run."""
    if manifest.get("data-note"):
        doc.add(manifest["data-note"], "")
    doc.add(
        "Experiment file: `" + manifest.get("experiment-file", "?") + "` (copied to "
        "`experiment.toml` in this folder).",
        "",
    )
    doc.add("## Software", "")
    for k, v in manifest.get("versions", {}).items():
        doc.add(f"- {k} {v}")
    doc.add("")
