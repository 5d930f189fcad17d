"""How uneven a fleet's pace is: each node's best round time on its twin, and the
**straggler ratio** (the slowest node's best round time ÷ the median node's).

A node's *best round time* is the round plan's (``strategies.round_plan.best_round_time_s``):
its round's training samples × the least time per sample over the (b, f) cells feasible
under its cap with its margin, judged as the nodes judge a profiled LUT (robust peak =
peak + ``peak-sigma-k`` × σ < P_max · (1 − cap-margin), ``feasibility.feasible_cells``). Here
the LUT is the twin's noiseless model (``fl_client.devices.simulated``) and σ of a cell's
per-step peaks is the twin's sensor noise (``power-noise`` × peak), what a profiled cell
of the twin would show. It is the cell the node that sets the pace takes (its fastest),
not the per-device rule's time × r choice, which needs the proxy's r (a run's output).

With ``samples`` left out every node holds the same share of the data (the ratio is then
the hardware's alone; a Dirichlet split adds each seed's data sizes, give them as
``samples``). The median of an even fleet is the mean of its two middle nodes.

    python -m simulations.experiments.fleet_pace [FLEET ...]

prints each fleet's nodes and ratio (the shipped fleets without arguments).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fl_client.devices import simulated as sim
from fl_client.devices.descriptors import load_device_spec
from fl_client.feasibility import feasible_cells
from fl_client.power import PowerLimit
from fl_client.selection import Tables
from fl_client.settings import load_fleet
from fl_client.settings_table import RUN
from fl_client.shipped import shipped_names
from strategies.round_plan import PACE, best_round_time_s

#: The run settings' defaults the pace is judged with (their entries in the settings table).
DEFAULT_BATCH_SIZES: tuple[int, ...] = tuple(RUN["batch-sizes"].value)
DEFAULT_CAP_MARGIN: float = RUN["cap-margin"].value
DEFAULT_PEAK_SIGMA_K: float = RUN["peak-sigma-k"].value


@dataclass(frozen=True)
class NodePace:
    """One node's fastest feasible cell on its twin and its best round time."""

    name: str
    device: str
    p_max_w: float  # inf: no cap
    batch_size: int
    freq_mhz: float
    time_per_sample_s: float
    samples: float
    round_time_s: float


@dataclass(frozen=True)
class FleetPace:
    """Every node's pace; ``ratio``: the slowest node's round time ÷ the median node's."""

    nodes: tuple[NodePace, ...]

    @property
    def slowest(self) -> NodePace:
        return max(self.nodes, key=lambda n: n.round_time_s)

    @property
    def median_round_time_s(self) -> float:
        return float(statistics.median(n.round_time_s for n in self.nodes))

    @property
    def ratio(self) -> float:
        return self.slowest.round_time_s / self.median_round_time_s


@dataclass(frozen=True)
class PaceRule:
    """What every node's pace is judged with: the model's training FLOPs per sample, the
    candidate batch sizes and the robust peak's ``peak-sigma-k``."""

    flops_per_sample: float
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES
    peak_sigma_k: float = DEFAULT_PEAK_SIGMA_K


def node_pace(
    name: str, device: str, limit: PowerLimit, rule: PaceRule, *, samples: float = 1.0
) -> NodePace:
    """A node's fastest feasible cell on the twin of ``device`` under ``limit``, judged by
    ``rule``; ``samples``: its round's training samples.

    Raises ValueError naming the node when no cell is feasible under its cap.
    """
    flops_per_sample, batch_sizes = rule.flops_per_sample, rule.batch_sizes
    peak_sigma_k = rule.peak_sigma_k
    spec = load_device_spec(device)
    freqs = spec.gpu_freqs_mhz
    time_s = np.array(
        [[sim.time_per_sample_s(spec, b, f, flops_per_sample) for f in freqs] for b in batch_sizes]
    )
    peak_w = np.array(
        [[sim.power_w(spec, b, f, flops_per_sample) for f in freqs] for b in batch_sizes]
    )
    sigma_w = spec.power_noise * peak_w
    best = best_round_time_s(
        Tables(time_s, peak_w, peak_sigma_w=sigma_w),
        limit,
        samples,
        objective=PACE.but(peak_sigma_k=peak_sigma_k, tie_tolerance=0.0),
    )
    if not math.isfinite(best):
        raise ValueError(f"{name}: no (b, f) of {device} is feasible under {limit.p_max_w:g} W")
    ok = feasible_cells(peak_w, limit, peak_sigma_w=sigma_w, peak_sigma_k=peak_sigma_k)
    i, j = (
        int(k) for k in np.unravel_index(int(np.argmin(np.where(ok, time_s, np.inf))), time_s.shape)
    )
    return NodePace(
        name=name,
        device=device,
        p_max_w=limit.p_max_w,
        batch_size=int(batch_sizes[i]),
        freq_mhz=float(freqs[j]),
        time_per_sample_s=float(time_s[i, j]),
        samples=float(samples),
        round_time_s=best,
    )


def fleet_pace(
    fleet: str | Path,
    *,
    model: str = "cnn",
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    cap_margin: float = DEFAULT_CAP_MARGIN,
    peak_sigma_k: float = DEFAULT_PEAK_SIGMA_K,
    samples: Mapping[str, float] | None = None,
) -> FleetPace:
    """Each node's best round time on its twin under its cap (round 1's cap where it has a
    schedule; a node's own ``cap-margin`` overrides ``cap_margin``), for ``model``.

    ``samples``: node name → its round's training samples (default: 1 each, equal shares).
    """
    from fl_client import model_zoo  # torch: only when a pace is computed

    rule = PaceRule(model_zoo.train_flops_per_sample(model), batch_sizes, peak_sigma_k)
    nodes = []
    for node in load_fleet(fleet):
        margin = cap_margin if node.cap_margin is None else node.cap_margin
        limit = PowerLimit(node.p_max_at(1).watts, margin)
        n = 1.0 if samples is None else float(samples[node.name])
        nodes.append(node_pace(node.name, node.device, limit, rule, samples=n))
    return FleetPace(tuple(nodes))


def format_pace(name: str, pace: FleetPace) -> str:
    """A fleet's nodes (fastest cell, time per sample) and its ratio, as text."""
    lines = [f"fleet {name}: slowest ÷ median best round time = {pace.ratio:.2f}×"]
    for n in sorted(pace.nodes, key=lambda n: n.round_time_s):
        cap = "none" if math.isinf(n.p_max_w) else f"{n.p_max_w:g} W"
        lines.append(
            f"  {n.name:<16} {n.device:<17} cap {cap:<7} b={n.batch_size:<4} "
            f"{n.freq_mhz:7.2f} MHz  {1e3 * n.time_per_sample_s:.4f} ms/sample"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.experiments.fleet_pace",
        description="Each node's best round time on its twin and the fleet's straggler ratio.",
    )
    parser.add_argument("fleets", nargs="*", help="fleet names or files (default: shipped)")
    parser.add_argument("--model", default="cnn")
    args = parser.parse_args(argv)
    for name in args.fleets or shipped_names("fleets"):
        print(format_pace(name, fleet_pace(name, model=args.model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
