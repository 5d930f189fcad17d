"""Fleet-shared profiling: one LUT per node kind, measured in slices by the kind's nodes.

Nodes of one kind (device kind, backend, model, input shape, B, frequency table) see the
same LUT up to unit-to-unit spread, so they measure it together, in two exchanges:

1. **seed** — a few cells spread over the (b, f) grid (``fl_client.lut_fit.seed_cells``,
   8 by default), dealt round-robin to the kind's nodes, so each measures a disjoint slice;
2. **confirm** — a fit of time and power to the seed cells (``fl_client.lut_fit.fit_lut``)
   predicts, for every distinct cap of the kind, Eq. 4's choice and the cell above it in
   its row (the cap's boundary); the ones not measured yet (≤ ``cells_per_cap``) go to the
   nodes under that cap.

The kind's LUT holds the measured cells only (the median where slices overlap): a fitted
cell never decides anything, and every node then checks its own chosen cell on its own
board before it trains (``fl_client.node``). No Flower import: the strategy sends the
requests and hands the replies in.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fl_client.contract import Cap, CellsReport, NodeDescriptor
from fl_client.lut import LUT, KindKey
from fl_client.lut_fit import eq4_choice, fit_lut, seed_cells

#: A cell to measure, as (batch size, GPU frequency in MHz).
Cell = tuple[int, float]


@dataclass(frozen=True)
class SharedOptions:
    """Budgets of fleet-shared profiling (run settings ``shared-seed-cells`` and
    ``shared-cells-per-cap``)."""

    seed_cells: int = 8
    cells_per_cap: int = 2
    tie_tolerance: float = 0.02


@dataclass
class KindProfile:
    """One kind's nodes, their caps, and the cells measured for it so far."""

    kind: KindKey
    nodes: list[int]
    caps: dict[int, list[tuple[Cap, float]]]  # node -> every (cap, cap-margin) it runs under
    measured: dict[Cell, list[tuple[float, float, float]]] = field(default_factory=dict)

    def add(self, report: CellsReport) -> None:
        """Cells a node measured (failed measurements — not finite or ≤ 0 — are dropped)."""
        for b, f, t, p, a in zip(
            report.cells_b,
            report.cells_freq_mhz,
            report.time_per_sample_s,
            report.peak_power_w,
            report.avg_power_w,
            strict=True,
        ):
            if all(math.isfinite(x) and x > 0 for x in (t, p, a)):
                self.measured.setdefault((int(b), float(f)), []).append((t, p, a))

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Time per sample, peak and average power, NaN where not measured; the median where
        several nodes measured a cell."""
        b, f = self.kind.batch_sizes, self.kind.freqs_mhz
        out = [np.full((len(b), len(f)), np.nan) for _ in range(3)]
        for (bb, ff), values in self.measured.items():
            i, j = b.index(bb), f.index(ff)
            med = np.median(np.asarray(values), axis=0)
            for k in range(3):
                out[k][i, j] = med[k]
        return out[0], out[1], out[2]

    def lut(self, profile_time_s: float, profile_energy_j: float) -> LUT | None:
        """The kind's shared LUT, or None when nothing was measured."""
        if not self.measured:
            return None
        time_s, peak_w, avg_w = self.tables()
        k = self.kind
        return LUT(
            device_kind=k.device_kind,
            backend=k.backend,
            model_name=k.model_name,
            input_shape=k.input_shape,
            batch_sizes=k.batch_sizes,
            freqs_mhz=k.freqs_mhz,
            time_per_sample_s=time_s,
            peak_power_w=peak_w,
            avg_power_w=avg_w,
            profile_time_s=profile_time_s,
            profile_energy_j=profile_energy_j,
            grid="shared",
        )


def kinds_of(
    fleet: Mapping[int, NodeDescriptor],
    batch_sizes: Mapping[int, Sequence[int]],
    model: str,
    input_shape: tuple[int, ...],
) -> dict[KindKey, KindProfile]:
    """The fleet grouped by kind, each node with every cap it runs under (its schedule's)."""
    kinds: dict[KindKey, KindProfile] = {}
    for node_id in sorted(fleet, key=lambda n: (fleet[n].node_name, n)):
        d = fleet[node_id]
        kind = KindKey(
            d.device,
            d.backend,
            model,
            tuple(input_shape),
            tuple(batch_sizes[node_id]),
            tuple(d.gpu_freqs_mhz),
        )
        prof = kinds.setdefault(kind, KindProfile(kind, [], {}))
        prof.nodes.append(node_id)
        prof.caps[node_id] = [(cap, d.cap_margin) for cap in d.all_caps()]
    return kinds


def seed_requests(
    kinds: Mapping[KindKey, KindProfile], opts: SharedOptions
) -> dict[int, list[Cell]]:
    """Exchange 1: each kind's seed cells dealt round-robin over its nodes (disjoint slices)."""
    out: dict[int, list[Cell]] = defaultdict(list)
    for prof in kinds.values():
        b, f = prof.kind.batch_sizes, prof.kind.freqs_mhz
        for k, (i, j) in enumerate(seed_cells(len(b), len(f), opts.seed_cells)):
            out[prof.nodes[k % len(prof.nodes)]].append((b[i], f[j]))
    return dict(out)


def confirm_requests(
    kinds: Mapping[KindKey, KindProfile],
    r_of: Mapping[KindKey, Sequence[float]],
    opts: SharedOptions,
) -> dict[int, list[Cell]]:
    """Exchange 2: per distinct cap of a kind, the fit's Eq. 4 choice and the cell above it
    in its row, where not measured yet; measured by the nodes under that cap."""
    out: dict[int, list[Cell]] = defaultdict(list)
    for kind, prof in kinds.items():
        time_s, peak_w, avg_w = prof.tables()
        if np.count_nonzero(~np.isnan(time_s)) < 2:
            continue  # too little to fit: the kind's nodes profile their own
        fit = fit_lut(kind.batch_sizes, kind.freqs_mhz, time_s, peak_w, avg_w)
        by_limit: dict[float, list[int]] = defaultdict(list)
        for node_id, caps in prof.caps.items():
            for cap, margin in caps:
                by_limit[cap.selection_w(margin)].append(node_id)
        for limit_w, nodes in sorted(by_limit.items()):
            pick = eq4_choice(
                fit.time_per_sample_s,
                fit.peak_power_w,
                fit.avg_power_w,
                r_of[kind],
                limit_w,
                opts.tie_tolerance,
            )
            if pick is None:
                continue
            i, j = pick
            cells = [(i, j)] + ([(i, j + 1)] if j + 1 < len(kind.freqs_mhz) else [])
            todo = [
                (kind.batch_sizes[a], kind.freqs_mhz[c])
                for a, c in cells
                if (kind.batch_sizes[a], kind.freqs_mhz[c]) not in prof.measured
            ][: opts.cells_per_cap]
            for k, cell in enumerate(todo):
                out[nodes[k % len(nodes)]].append(cell)
    return dict(out)
