"""The ``powerfl`` command line: simulate a fleet, and (later) devices, profile, experiments."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from fl_client.settings import SettingsError, tomllib
from simulations.run import flower_env, simulate


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs; values parsed as TOML scalars when they parse, else strings."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise SettingsError(f"--run-config: expected key=value, got {item!r}")
        key, raw = item.split("=", 1)
        try:
            out[key.strip()] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = raw
    return out


def print_comparison(summaries: list[dict[str, Any]]) -> None:
    """Side-by-side table of methods run on the same fleet, data and seeds."""
    from rich.table import Table

    from fl_server.results import make_console

    table = Table(title="Methods on the same fleet, data and seeds", title_justify="left")
    for col in (
        "method",
        "final acc",
        "round→target",
        "time→target s",
        "energy→target J",
        "sim s",
        "energy J",
        "idle wait J",
        "profiling",
    ):
        table.add_column(col, justify="left" if col == "method" else "right")

    def fmt(x: float | None, scale: float = 1.0, digits: int = 1) -> str:
        return "-" if x is None else f"{x / scale:.{digits}f}"

    for s in summaries:
        table.add_row(
            s["method"],
            f"{s['final-accuracy']:.3f}",
            str(s["round-to-target"] or "-"),
            fmt(s["sim-time-to-target-s"]),
            fmt(s["fleet-energy-to-target-j"], 1, 1),
            fmt(s["sim-time-s"]),
            fmt(s["fleet-energy-j"], 1, 1),
            fmt(s.get("fleet-wait-energy-j"), 1, 1),
            f"{100 * s['profile-share']:.1f}%",
        )
    console = make_console()
    console.print(table)
    base = summaries[0]
    for other in summaries[1:]:
        t0, t1 = base["sim-time-to-target-s"], other["sim-time-to-target-s"]
        e0, e1 = base["fleet-energy-to-target-j"], other["fleet-energy-to-target-j"]
        if t0 and t1 and e0 and e1:
            console.print(
                f"{base['method']} vs {other['method']}: {t1 / t0:.2f}× less time to target, "
                f"{e1 / e0:.2f}× less fleet energy to target"
            )
        elif t0 and e0:
            console.print(
                f"{other['method']} did not reach the target within its {other['rounds']} "
                f"rounds ({other['sim-time-s']:.1f} s, {other['fleet-energy-j']:.1f} J); "
                f"{base['method']} reached it in {t0:.1f} s with {e0:.1f} J: at least "
                f"{other['sim-time-s'] / t0:.2f}× less time"
            )
        elif t1 and e1:
            console.print(
                f"{base['method']} did not reach the target within its {base['rounds']} "
                f"rounds ({base['sim-time-s']:.1f} s); {other['method']} reached it in "
                f"{t1:.1f} s with {e1:.1f} J"
            )
        else:
            console.print(
                f"{base['method']} vs {other['method']}: target not reached by either; "
                f"compare final accuracy and totals above"
            )


def cmd_simulate(args: argparse.Namespace) -> int:
    flower_env()
    overrides = parse_overrides(args.run_config or [])
    for key, value in (
        ("fleet", args.fleet),
        ("model", args.model),
        ("num-rounds", args.rounds),
        ("output-dir", args.output_dir),
    ):
        if value is not None:
            overrides[key] = value
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not methods:
        raise SettingsError("--methods: give at least one of power-aware, b1, b2, oracle, fixed")
    from fl_client.settings import RunSettings

    for method in methods:  # every method's settings are checked before the first run starts
        RunSettings.from_config({**overrides, "method": method})
    t0 = time.perf_counter()
    summaries = []
    for method in methods:
        summaries.append(simulate({**overrides, "method": method}, backend=args.backend))
    if len(summaries) > 1:
        print_comparison(summaries)
    print(f"done in {time.perf_counter() - t0:.0f} s wall time; results:")
    for s in summaries:
        print(f"  {s['method']:<12} {s['run-dir']}")
    failed = [s["method"] for s in summaries if not any_node_trained(s)]
    if failed:
        print(
            f"powerfl: error: no node trained in any round of {', '.join(failed)}; "
            "the reasons are in the run's nodes.jsonl and the log above",
            file=sys.stderr,
        )
        return 1
    return 0


def any_node_trained(summary: dict[str, Any]) -> bool:
    """Whether at least one node returned an update in at least one round."""
    return any(n.get("rounds-ok", 0) > 0 for n in summary.get("nodes", {}).values())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="powerfl",
        description="Power-aware federated training for NVIDIA Jetson fleets, on Flower.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "simulate",
        help="run a Flower simulation of a Jetson fleet (digital twins)",
        description="Run the fleet in Flower's simulation engine, once per method, on the "
        "same fleet, data and seeds, and compare.",
    )
    p.add_argument(
        "--methods",
        default="power-aware,b1",
        help="comma-separated methods to run: power-aware, b1, b2, oracle, fixed "
        "(default: power-aware,b1)",
    )
    p.add_argument("--fleet", help="fleet file (default: configs/fleets/default.toml)")
    p.add_argument("--model", help="cnn | resnet18 | mobilenetv2 (default: cnn)")
    p.add_argument("--rounds", type=int, help="round budget (num-rounds)")
    p.add_argument("--output-dir", help="where run folders go (default: runs)")
    p.add_argument(
        "--run-config",
        "-c",
        action="append",
        metavar="KEY=VALUE",
        help="override any run setting of [tool.flwr.app.config], e.g. -c lr-ref=0.003",
    )
    p.add_argument("--backend", default="ray", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_simulate)
    from fl_client.cli_tools import add_device_commands  # devices, profile, select

    add_device_commands(sub)
    from simulations.experiments.cli import add_experiment_commands  # experiment run/report

    add_experiment_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except SettingsError as err:
        print(f"powerfl: error: {err}", file=sys.stderr)
        return 2
