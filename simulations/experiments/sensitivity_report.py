"""Report of a proxy-sensitivity study: matrices (Figs. 5–6), method table, plots, report.md.

Everything is computed from the saved records (``records/train``, ``records/lut``), so
``powerfl experiment report DIR`` re-renders it without training. Selection and time on
the target come from each device's full-grid LUT: for each cap, ours with r_P (Eq. 4) picks
(b_P, f_P); the fastest configuration for T is Eq. 4 with r_T; training time on T is
N_T(b)·t(b, f) (evaluation and profiling excluded, as in the paper's figures).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fl_client import selector
from fl_client.contract import Cap
from fl_client.r_cache import r_from_samples
from fl_client.selection import InfeasibleCapError, Tables
from simulations.experiments import report_kit as kit
from simulations.experiments.records import write_json
from simulations.experiments.report_kit import Doc, Output, ReportError

METHODS = ("b1", "b2", "power-aware", "oracle")
LABELS = {"b1": "Baseline 1", "b2": "Baseline 2", "power-aware": "Ours", "oracle": "Oracle"}
Samples = Mapping[int, int | None]


# --------------------------------------------------------------------------- analysis


@dataclass(frozen=True)
class Grid:
    """One device's full-grid LUT as arrays (rows: batch sizes, columns: frequencies)."""

    batch_sizes: list[int]
    knob_values: list[float]
    time_per_sample_s: np.ndarray
    peak_power_w: np.ndarray
    avg_power_w: np.ndarray
    b1_freq_mhz: dict[Cap, float | None]
    #: σ of each cell's per-step peaks (NaN: not recorded, as in records before LUT format 3)
    peak_sigma_w: np.ndarray | None = None

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> Grid:
        lut = rec["lut"]
        return cls(
            batch_sizes=[int(b) for b in lut["batch-sizes"]],
            knob_values=[float(f) for f in lut["freqs-mhz"]],
            time_per_sample_s=np.asarray(lut["time-per-sample-s"], dtype=float),
            peak_power_w=np.asarray(lut["peak-power-w"], dtype=float),
            avg_power_w=np.asarray(rec["avg-power-w"], dtype=float),
            b1_freq_mhz={kit.cap_of(k): v for k, v in rec["b1-freq-mhz"].items()},
            peak_sigma_w=(
                np.asarray(lut["peak-sigma-w"], dtype=float) if "peak-sigma-w" in lut else None
            ),
        )

    def rows(self, sizes: list[int]) -> Tables:
        """The rows of ``sizes`` as the node's selector reads them: time, peak and average
        power and σ of the per-step peaks (the robust feasibility of ``peak-sigma-k``)."""
        idx = [self.batch_sizes.index(b) for b in sizes]
        sigma = None if self.peak_sigma_w is None else self.peak_sigma_w[idx]
        return Tables(
            self.time_per_sample_s[idx], self.peak_power_w[idx], self.avg_power_w[idx], sigma
        )

    def cell(self, b: int, f_mhz: float) -> tuple[float, float]:
        """(time per sample s, average power W) at (b, f)."""
        i, j = self.batch_sizes.index(b), self.knob_values.index(f_mhz)
        return float(self.time_per_sample_s[i, j]), float(self.avg_power_w[i, j])


def choose(method: str, grid: Grid, cap: object, n_proxy: Samples) -> tuple[int, float]:
    """(b, f) of ``method`` under ``cap`` given the proxy's samples to target (the
    target's, for the oracle). Raises ValueError (incl. ``InfeasibleCapError``)
    when it has none."""
    sizes = grid.batch_sizes
    if method in ("b1", "b2"):
        b1_mhz = grid.b1_freq_mhz.get(kit.cap_of(cap))
        if b1_mhz is None:
            raise ValueError("no safe B1 frequency band for this cap")
        bs, r = (sizes, None) if method == "b1" else r_from_samples(n_proxy, sizes)
        if not bs:
            raise ValueError("no batch size reached the proxy's accuracy target")
        how = selector.Method(method, b1_max_knob_value=b1_mhz)
        sel = selector.select(how, batch_sizes=bs, knob_values=grid.knob_values, r=r)
        return sel.batch_size, sel.knob_value
    bs, r = r_from_samples(n_proxy, sizes)
    if not bs:
        raise ValueError("no batch size reached the accuracy target")
    sel = selector.select(
        method,
        batch_sizes=bs,
        knob_values=grid.knob_values,
        tables=grid.rows(bs),
        r=r,
        limit=kit.cap_of(cap).watts,
    )
    return sel.batch_size, sel.knob_value


def time_on_target(
    grid: Grid, b: int, f_mhz: float, n_target: Samples
) -> tuple[float, float] | None:
    """(training time s, energy J) of N_T(b) samples at (b, f); None if b never reached T."""
    n = n_target.get(b)
    if n is None:
        return None
    tps, p_avg = grid.cell(b, f_mhz)
    return n * tps, n * tps * p_avg


def samples_by(train: list[dict[str, Any]]) -> dict[tuple[str, int], dict[int, int | None]]:
    """(dataset, seed) → {b: samples to target or None}."""
    out: dict[tuple[str, int], dict[int, int | None]] = {}
    for r in train:
        key = (r["dataset"], int(r["seed"]))
        out.setdefault(key, {})[int(r["batch-size"])] = r["samples-to-target"]
    return out


@dataclass(frozen=True)
class CapCase:
    """One device and cap of the analysis, with every run's samples to target."""

    grid: Grid
    cap: object  # as in the settings: watts or "none"
    n: dict[tuple[str, int], dict[int, int | None]]
    seeds: list[int]


def _oracle_by_seed(case: CapCase, t: str) -> dict[int, tuple[int, float, float] | None]:
    """Per seed, the fastest configuration on target ``t`` and its training time."""
    out: dict[int, tuple[int, float, float] | None] = {}
    for s in case.seeds:
        n_t = case.n.get((t, s))
        if n_t is None:
            continue
        try:
            b, f = choose("oracle", case.grid, case.cap, n_t)
        except ValueError:
            out[s] = None
            continue
        te = time_on_target(case.grid, b, f, n_t)
        out[s] = None if te is None else (b, f, te[0])
    return out


def _matrix_cell(
    case: CapCase, p: str, t: str, oracle: dict[int, tuple[int, float, float] | None]
) -> dict[str, Any]:
    """Time increase (%) on ``t`` of ours with proxy ``p`` over the fastest configuration."""
    cell: dict[str, Any] = {"increase-pct": [], "same-choice": 0, "seeds": 0}
    notes: set[str] = set()
    for s, orc in oracle.items():
        n_p, n_t = case.n.get((p, s)), case.n.get((t, s))
        if orc is None or n_p is None or n_t is None:
            notes.add("no oracle")
            continue
        try:
            b, f = choose("power-aware", case.grid, case.cap, n_p)
        except InfeasibleCapError:
            notes.add("infeasible")
            continue
        except ValueError:
            notes.add("proxy never reached its target")
            continue
        te = time_on_target(case.grid, b, f, n_t)
        cell["seeds"] += 1
        if te is None:
            notes.add(f"b={b} never reached {t}'s target")
            continue
        cell["increase-pct"].append(100.0 * (te[0] / orc[2] - 1.0))
        cell["same-choice"] += int((b, f) == (orc[0], orc[1]))
    cell["notes"] = sorted(notes)
    return cell


def _method_on(case: CapCase, method: str, ref: str, t: str) -> dict[str, Any]:
    """Training time and energy on ``t`` of ``method`` with r from ``ref`` (all seeds)."""
    rec: dict[str, Any] = {"time-s": [], "energy-j": [], "choices": [], "notes": []}
    for s in case.seeds:
        n_p, n_t = case.n.get((ref, s)), case.n.get((t, s))
        if n_p is None or n_t is None:
            continue
        try:
            b, f = choose(method, case.grid, case.cap, n_t if method == "oracle" else n_p)
        except ValueError as err:
            rec["notes"].append(str(err))
            continue
        te = time_on_target(case.grid, b, f, n_t)
        rec["choices"].append([b, f])
        if te is None:
            rec["notes"].append(f"b={b} never reached the target")
            continue
        rec["time-s"].append(te[0])
        rec["energy-j"].append(te[1])
    return rec


def _analyse_cap(case: CapCase, datasets: list[str], ref: str) -> dict[str, Any]:
    matrix: dict[str, dict[str, Any]] = {}
    methods: dict[str, dict[str, Any]] = {}
    for t in datasets:
        oracle = _oracle_by_seed(case, t)
        for p in datasets:
            matrix.setdefault(p, {})[t] = _matrix_cell(case, p, t, oracle)
        if t != ref:
            methods[t] = {m: _method_on(case, m, ref, t) for m in METHODS}
    return {"matrix": matrix, "methods": methods}


def analyse(
    config: Mapping[str, Any], train: list[dict[str, Any]], luts: list[dict[str, Any]]
) -> dict[str, Any]:
    """Per device and cap: the proxy × target matrix of time increase (%) over the fastest
    configuration, and the methods' training time and energy per target (all seeds)."""
    datasets = list(config["datasets"])
    n = samples_by(train)
    seeds = sorted({s for _, s in n})
    out: dict[str, Any] = {"datasets": datasets, "seeds": seeds, "devices": {}}
    for lut_rec in sorted(luts, key=lambda r: r["device"]):
        grid = Grid.from_record(lut_rec)
        caps = {
            kit.cap_label(cap): _analyse_cap(
                CapCase(grid, cap, n, seeds), datasets, config["reference-proxy"]
            )
            for cap in config["caps-w"]
        }
        out["devices"][lut_rec["device"]] = {
            "display-name": lut_rec.get("display-name"),
            "caps": caps,
        }
    return out


# --------------------------------------------------------------------------- text and plots


def _ms(xs: list[float]) -> tuple[float | None, float | None]:
    """Mean ± std, no std for a single seed."""
    m, s = kit.mean_std(xs)
    return m, (s if len(xs) > 1 else None)


def _cell_text(cell: Mapping[str, Any]) -> str:
    xs = cell["increase-pct"]
    if not xs:
        return "n/a (" + "; ".join(cell["notes"]) + ")" if cell["notes"] else "n/a"
    m, s = _ms(xs)
    text = f"{m:+.1f}" if s is None else f"{m:+.1f} ± {s:.1f}"
    if len(xs) < cell["seeds"]:
        text += f" ({cell['seeds'] - len(xs)} seed(s) n/a)"
    return text


def _heatmap(out: Path, device: str, a: Mapping[str, Any], datasets: list[str]) -> str:
    plt = kit.pyplot()
    caps = list(a["caps"])
    stem = f"fig-proxy-sensitivity-{device}"
    rows: list[list[Any]] = []
    fig, axes = plt.subplots(1, len(caps), figsize=(4.2 * len(caps), 3.8), squeeze=False)
    for ax, cap in zip(axes[0], caps, strict=True):
        mat = np.full((len(datasets), len(datasets)), np.nan)
        for i, p in enumerate(datasets):
            for j, t in enumerate(datasets):
                xs = a["caps"][cap]["matrix"][p][t]["increase-pct"]
                if xs:
                    mat[i, j] = statistics.fmean(xs)
                rows.append([cap, p, t, None if np.isnan(mat[i, j]) else round(mat[i, j], 3)])
        vmax = max(5.0, float(np.nanmax(mat)) if np.isfinite(mat).any() else 5.0)
        ax.imshow(mat, cmap="Reds", vmin=0.0, vmax=vmax)
        for i in range(len(datasets)):
            for j in range(len(datasets)):
                v = mat[i, j]
                ax.text(j, i, "n/a" if np.isnan(v) else f"{v:.1f}", ha="center", va="center")
        ax.set_xticks(range(len(datasets)), datasets, rotation=30, ha="right")
        ax.set_yticks(range(len(datasets)), datasets)
        ax.set_title(f"P_max = {cap}")
        ax.set_xlabel("target")
    axes[0][0].set_ylabel("proxy")
    fig.suptitle(f"Time increase (%) over the fastest configuration — {a['display-name']}")
    kit.save_figure(fig, out / f"{stem}.png", dpi=120)
    kit.write_csv(out / f"{stem}.csv", ["cap", "proxy", "target", "increase-pct-mean"], rows)
    return stem


# --------------------------------------------------------------------------- report.md


def render(out: Path) -> Path:
    """Write summary.json, the heatmaps (PNG + CSV) and report.md into ``out``."""
    output = kit.load_output(out)
    train, luts = output.records("train"), output.records("lut")
    if not train or not luts:
        raise ReportError(f"{out}: no training or LUT records yet")
    config, manifest = output.config, output.manifest
    summary = analyse(config, train, luts)
    write_json(out / "summary.json", summary)
    doc = Doc()
    doc.add(f"# Proxy sensitivity: {config['name']} ({config['scale']} scale)", "")
    if config.get("description"):
        doc.add(config["description"], "")
    doc.add(f"Command: `{manifest['command']}`", "")
    if not manifest.get("complete"):
        doc.add("**Incomplete run**: the tables below use the records written so far.", "")
    doc.add(_headline(summary), "")
    _samples_section(doc, config, summary, train)
    for dev, a in summary["devices"].items():
        _device_section(doc, output, dev, a, summary["datasets"])
    _settings_section(doc, output)
    return doc.write(out / "report.md", final_newline=True)


def _samples_text(xs: list[int | None]) -> str:
    got = [float(x) for x in xs if x is not None]
    if not xs:
        return "(not run)"
    if len(got) < len(xs):
        return f"{kit.fmt(*_ms(got), digits=0)} ({len(xs) - len(got)}/{len(xs)} —)" if got else "—"
    return kit.fmt(*_ms(got), digits=0)


def _samples_section(
    doc: Doc, config: Mapping[str, Any], summary: Mapping[str, Any], train: list[dict[str, Any]]
) -> None:
    doc.add("## Samples to the accuracy target (training runs, mean ± std over seeds)", "")
    doc.add(
        f"Model `{config['model']}`; lr {config['lr-ref']:g}·sqrt(b/{config['b-ref']}); — : "
        f"not reached within {config['max-samples']} samples.",
        "",
    )
    bs = list(config["batch-sizes"])
    doc.table(["dataset", "target acc.", *(f"b={b}" for b in bs)])
    n = samples_by(train)
    for d in summary["datasets"]:
        cells = [
            _samples_text([n[(d, s)][b] for s in summary["seeds"] if b in n.get((d, s), {})])
            for b in bs
        ]
        doc.row(d, f"{config['accuracy'][d]:g}", *cells)
    doc.add("")


def _device_section(
    doc: Doc, output: Output, dev: str, a: Mapping[str, Any], datasets: list[str]
) -> None:
    """The matrices and heatmap of one device, then its methods with the reference proxy."""
    doc.add(
        f"## {a['display-name']}: time increase (%) of ours with proxy P over the "
        "fastest configuration on T",
        "",
    )
    doc.add(
        "Rows: proxy P; columns: target T. 0 = ours picks the oracle's (b, f). Training "
        "time N_T(b)·t(b, f) from the twin's full-grid LUT; profiling and evaluation "
        "excluded (as in the paper's Figs. 5–6).",
        "",
    )
    for cap, c in a["caps"].items():
        doc.add(f"**P_max = {cap}**", "")
        doc.table(["proxy \\ target", *datasets])
        for p in datasets:
            doc.row(p, *(_cell_text(c["matrix"][p][t]) for t in datasets))
        doc.add("")
    fig = _heatmap(output.folder, dev, a, datasets)
    doc.add(f"![{dev}]({fig}.png) (data: `{fig}.csv`)", "")
    _methods_table(doc, output.config["reference-proxy"], a, datasets)


def _methods_table(doc: Doc, ref: str, a: Mapping[str, Any], datasets: list[str]) -> None:
    doc.add(f"### {a['display-name']}: methods with proxy `{ref}` (Table 2/3 style)", "")
    doc.add(
        "Training time (s) and energy (J) to the target, mean ± std over seeds; "
        "profiling and evaluation excluded. Ratios of means.",
        "",
    )
    doc.table(
        [
            "target",
            "P_max",
            *(f"{LABELS[m]} s" for m in METHODS),
            "B1/ours",
            "B2/ours",
            "ours/oracle",
            *(f"{LABELS[m]} J" for m in METHODS),
        ]
    )
    for t in datasets:
        if t == ref:
            continue
        for cap, c in a["caps"].items():
            ms = c["methods"][t]
            means = {m: kit.mean_std(ms[m]["time-s"])[0] for m in METHODS}
            ratios = [
                kit.ratio(kit.ratio_of(means[x], means[y]))
                for x, y in (
                    ("b1", "power-aware"),
                    ("b2", "power-aware"),
                    ("power-aware", "oracle"),
                )
            ]
            doc.row(
                t,
                cap,
                *(kit.fmt(*_ms(ms[m]["time-s"])) for m in METHODS),
                *ratios,
                *(kit.fmt(*_ms(ms[m]["energy-j"])) for m in METHODS),
            )
    doc.add("")
    notes = sorted(
        {
            f"{LABELS[m]} at {cap} on {t}: {x}"
            for cap, c in a["caps"].items()
            for t, ms in c["methods"].items()
            for m in METHODS
            for x in ms[m]["notes"]
        }
    )
    if notes:
        doc.add("Unavailable entries: " + "; ".join(notes) + ".", "")


def _settings_section(doc: Doc, output: Output) -> None:
    manifest = output.manifest
    doc.add("## Settings", "")
    doc.table(("key", "value"), ((k, f"`{json.dumps(v)}`") for k, v in output.config.items()))
    doc.add("")
    doc.add("Data sizes: `" + json.dumps(manifest.get("data-sizes", {})) + "`", "")
    doc.add(manifest.get("data-note", ""), "")
    versions = manifest.get("versions", {}).items()
    doc.add("Software: " + ", ".join(f"{k} {v}" for k, v in versions), "")


def _off_diagonal(c: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [cell for p, row in c["matrix"].items() for t, cell in row.items() if p != t]


def _headline(summary: Mapping[str, Any]) -> str:
    """A few sentences a reader can check against the paper's §5.4 claim."""
    parts: list[str] = []
    for a in summary["devices"].values():
        per_cap = []
        for cap, c in a["caps"].items():
            cells = _off_diagonal(c)
            xs = [x for cell in cells for x in cell["increase-pct"]]
            same = sum(cell["same-choice"] for cell in cells)
            total = sum(len(cell["increase-pct"]) for cell in cells)
            na = sum(cell["seeds"] - len(cell["increase-pct"]) for cell in cells)
            if xs:
                per_cap.append(
                    f"at {cap} the mean increase over off-diagonal pairs and seeds is "
                    f"{statistics.fmean(xs):.1f}% (max {max(xs):.1f}%), ours picks the fastest "
                    f"configuration in {same} of {total}"
                    + (f", {na} pair-seed(s) not comparable" if na else "")
                )
        if per_cap:
            parts.append(f"**{a['display-name']}**: " + "; ".join(per_cap) + ".")
    paper = (
        "The paper (§5.4, Figs. 5–6) finds the method insensitive to the proxy: the optimal "
        "configuration in most image cases (a few misses without a cap) and in every text case."
    )
    return "**Headline.** " + " ".join(parts) + " " + paper
