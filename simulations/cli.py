"""The ``powerfl`` command line: simulate a fleet, devices, profile, select, experiments."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from fl_client.argparse_once import OnceParser
from fl_client.effective import check_effective, named_by_caller
from fl_client.preflight import check_writable_dir
from fl_client.settings import SettingsError, check_partitioner_keys, key_values, with_app_paths
from simulations.run import (
    ENGINES,
    RunInterrupted,
    default_engine,
    flower_env,
    interruptible,
    preflight,
    simulate,
    stop_engine,
)
from simulations.superlink import RuntimeRunError
from simulations.tracking import log_pictures


def package_version() -> str:
    """The installed distribution's version (``pyproject.toml``'s ``[project] version``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("powerfl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``-c key=value`` pairs (``settings.key_values``): values parsed as TOML scalars when
    they parse, else strings; a key given twice with different values is an error."""
    return key_values(items, "-c")


def print_comparison(summaries: list[dict[str, Any]]) -> None:
    """Side-by-side table of methods run on the same fleet, data and seeds: the round that
    reached the target (by the mean over ``target-window`` rounds) and the first round at
    it, the headline energy (idle waiting counted by ``idle-accounting``) and its two
    parts."""
    from rich.table import Table

    from fl_server.results import make_console

    counted = all(s.get("idle-accounting") == "on" for s in summaries)
    title = "Methods on the same fleet, data and seeds; energy " + (
        "= w/o idle + idle waiting (idle-accounting = on)"
        if counted
        else "= w/o idle (idle-accounting = off)"
    )
    windows = sorted({int(s["target-window"]) for s in summaries})
    first_apart = windows != [1]  # a window of 1: the first round at the target is the round
    if first_apart:
        over = f"{windows[0]} rounds" if len(windows) == 1 else "target-window rounds"
        title += f"; round→target: the first round whose mean accuracy over {over} reaches it"
    table = Table(title=title, title_justify="left")
    for col in (
        "method",
        "final acc",
        "round→target",
        *(["first at target"] if first_apart else []),
        "time→target s",
        "energy→target J",
        "w/o idle J",
        "idle J",
        "profiling",
    ):
        table.add_column(col, justify="left" if col == "method" else "right", no_wrap=True)

    def fmt(x: float | None, scale: float = 1.0, digits: int = 1) -> str:
        return "-" if x is None else f"{x / scale:.{digits}f}"

    for s in summaries:
        table.add_row(
            s["method"],
            f"{s['final-accuracy']:.3f}",
            str(s["round-to-target"] or "-"),
            *([str(s["first-round-at-target"] or "-")] if first_apart else []),
            fmt(s["sim-time-to-target-s"]),
            fmt(s["fleet-energy-to-target-j"]),
            fmt(s.get("fleet-busy-energy-to-target-j")),
            fmt(s.get("fleet-idle-energy-to-target-j")),
            f"{100 * s['profile-share']:.1f}%",
        )
    console = make_console()
    console.print(table)
    base = summaries[0]
    for other in summaries[1:]:
        t0, t1 = base["sim-time-to-target-s"], other["sim-time-to-target-s"]
        e0, e1 = base["fleet-energy-to-target-j"], other["fleet-energy-to-target-j"]
        if t0 and t1 and e0 and e1:
            b0, b1 = base["fleet-busy-energy-to-target-j"], other["fleet-busy-energy-to-target-j"]
            console.print(
                f"{base['method']} vs {other['method']}: {t1 / t0:.2f}× less time to target, "
                f"{e1 / e0:.2f}× less fleet energy to target"
                + (f" ({b1 / b0:.2f}× without idle waiting)" if counted and b0 and b1 else "")
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


#: The methods ``simulate`` runs when neither ``--methods`` nor ``-c method=…`` names any.
DEFAULT_METHODS = ("power-aware", "b1")
FIXED_KEYS = ("fixed-batch-size", "fixed-freq-mhz")


def choose_methods(methods_arg: str | None, overrides: dict[str, Any]) -> list[str]:
    """The methods to run, in order: ``--methods``, or ``-c method=M`` (one run, as
    ``flwr run --run-config "method='M'"`` does), or ``DEFAULT_METHODS``.

    Both at once is refused unless they name the same single method: one of them would
    otherwise be dropped without a word.
    """
    typed = overrides.pop("method", None)
    if methods_arg is None:
        return [str(typed)] if typed is not None else list(DEFAULT_METHODS)
    methods = [m.strip() for m in methods_arg.split(",") if m.strip()]
    if not methods:
        raise SettingsError("--methods: give at least one of power-aware, b1, b2, oracle, fixed")
    if typed is not None and methods != [str(typed)]:
        raise SettingsError(
            f"method: -c method={typed} and --methods {methods_arg} both choose what runs; "
            "give one: --methods runs each listed method in turn on the same fleet, "
            "-c method=M runs M alone"
        )
    return methods


def check_fixed_keys(methods: list[str], overrides: dict[str, Any]) -> None:
    """``fixed-batch-size`` / ``fixed-freq-mhz`` typed for a run without ``fixed``: an error,
    since no method of the run would read them."""
    given = [k for k in FIXED_KEYS if overrides.get(k) not in (None, "", 0)]
    if given and "fixed" not in methods:
        raise SettingsError(
            f"{given[0]}: only the fixed method uses it, and this run's methods are "
            f"{', '.join(methods)}; add fixed to --methods or leave {given[0]} out"
        )


@dataclass
class SimulateProgress:
    """Where ``simulate`` is, for the one line an interruption prints."""

    methods: list[str]
    output_dir: Path
    cache_dir: Path
    method: str | None = None
    before: set[str] = field(default_factory=set)
    finished: list[tuple[str, str]] = field(default_factory=list)

    def start(self, method: str) -> None:
        self.method = method
        self.before = _folders(self.output_dir)

    def finish(self, run_dir: str) -> None:
        if self.method is not None:
            self.finished.append((self.method, run_dir))
        self.method = None

    def drop_empty_run_dirs(self) -> None:
        """Remove the current method's run folders that hold nothing (stopped before its
        first record), once its engine has stopped."""
        for folder in self.run_dirs():
            with contextlib.suppress(OSError):
                if not any(folder.iterdir()):
                    folder.rmdir()

    def run_dirs(self) -> list[Path]:
        """Folders the current method's run created since it started."""
        if self.method is None:
            return []
        pattern = re.compile(rf"-{re.escape(self.method)}(-\d+)?$")
        new = sorted(_folders(self.output_dir) - self.before)
        return [self.output_dir / n for n in new if pattern.search(n)]


def _folders(path: Path) -> set[str]:
    try:
        return {p.name for p in path.iterdir() if p.is_dir()}
    except OSError:
        return set()


_progress: SimulateProgress | None = None


def ray_address_arg(text: str) -> str:
    """``--ray-address``: ``HOST:PORT`` of a Ray cluster's head (port 1 … 65535)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT of the Ray cluster's head (e.g. 127.0.0.1:6379), got {text!r}"
        )
    return text.strip()


def _share_arg(*, zero_ok: bool) -> Callable[[str], float]:
    """An argparse type for a per-node share: a finite number > 0 (``--num-cpus``), or ≥ 0
    with ``zero_ok`` (``--num-gpus``)."""
    allowed = "a number >= 0" if zero_ok else "a number > 0"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}")
        return value

    return parse


def choose_engine(args: argparse.Namespace) -> str:
    """The engine of ``simulate``: ``--engine``, else ``runtime`` when ``--ray-address``
    is given, else ``simulations.run.default_engine()`` (``runtime`` on Flower ≥ 1.41).
    A cluster with ``--engine in-process`` is refused."""
    engine = args.engine or ("runtime" if args.ray_address else default_engine())
    if args.ray_address and engine != "runtime":
        raise SettingsError(
            f"--ray-address: a Ray cluster is joined through Flower's Simulation Runtime, not "
            f"with --engine {engine}; leave --engine out or give --engine runtime"
        )
    return engine


def check_runtime(args: argparse.Namespace, num_nodes: int) -> None:
    """What the Simulation Runtime path can refuse before the first run starts: an older
    Flower, a per-node share that cannot go to Flower (a fractional CPU on a cluster)."""
    from simulations.runtime import NodeResources, check_flower, federation_config

    check_flower()
    try:
        resources = NodeResources(num_cpus=args.num_cpus, num_gpus=args.num_gpus)
        federation_config(num_nodes, resources, ray_address=args.ray_address)
    except SettingsError as err:  # its messages name the setting: num-cpus / num-gpus
        raise SettingsError(f"--{err}" if str(err).startswith("num-") else str(err)) from None
    if args.ray_address:
        check_ray_head(args.ray_address)


#: Seconds to wait for the Ray head's port to accept a connection.
RAY_CONNECT_TIMEOUT_S = 5.0


def check_ray_head(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Something listens at ``--ray-address`` (a TCP connect within ``timeout_s``), before
    any engine starts: Ray itself waits for an absent head without a word."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return
    except OSError as err:
        why = "no answer" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise SettingsError(
            f"--ray-address: nothing answers at {address} ({why} within {timeout_s:g} s); "
            f"start the Ray cluster's head there (ray start --head --port={port}) or leave "
            "--ray-address out to run on a private Ray"
        ) from None


def typed_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The run settings typed for this command: the ``-c`` pairs with ``--fleet``,
    ``--model``, ``--rounds`` and ``--output-dir``; a key given both ways with two values is
    a SettingsError naming both."""
    overrides = parse_overrides(args.run_config or [])
    for key, value in (
        ("fleet", args.fleet),
        ("model", args.model),
        ("num-rounds", args.rounds),
        ("output-dir", args.output_dir),
    ):
        if value is None:
            continue
        if key in overrides and overrides[key] != value:
            flag = "--rounds" if key == "num-rounds" else f"--{key}"
            raise SettingsError(
                f"{key}: {flag} {value} and -c {key}={overrides[key]!r} both set it; give one"
            )
        overrides[key] = value
    return overrides


def cmd_simulate(args: argparse.Namespace) -> int:
    global _progress
    flower_env()
    overrides = typed_overrides(args)
    check_partitioner_keys(overrides)
    overrides = with_app_paths(overrides)
    engine = choose_engine(args)
    if engine == "in-process":  # its Flower writes there; the runtime has a private one
        check_writable_dir(os.environ["FLWR_HOME"], "FLWR_HOME")
    methods = choose_methods(args.methods, overrides)
    check_fixed_keys(methods, overrides)
    if overrides.get("run-dir") and len(methods) > 1:
        raise SettingsError(
            f"run-dir: names one run's folder, and this command runs {len(methods)} methods "
            f"({', '.join(methods)}); give one method, or leave run-dir out"
        )
    runs = []  # every method's settings are checked before the first run starts
    for method in methods:
        settings, fleet = preflight({**overrides, "method": method})
        runs.append(settings)
    idle = check_effective(runs, typed=overrides)
    if idle is not None:
        print(f"powerfl: warning: {idle}", file=sys.stderr, flush=True)
    if engine == "runtime":
        check_runtime(args, len(fleet))
    _progress = SimulateProgress(methods, Path(settings.output_dir), Path(settings.cache_dir))
    t0 = time.perf_counter()
    summaries = []
    for method in methods:
        _progress.start(method)
        try:
            with named_by_caller():  # the warning above is said once, not once more per run
                summary = simulate(
                    {**overrides, "method": method},
                    backend=args.backend,
                    num_cpus_per_node=args.num_cpus,
                    num_gpus_per_node=args.num_gpus,
                    engine=engine,
                    ray_address=args.ray_address,
                )
        except RuntimeRunError as err:  # the run's status and its log's tail, no traceback
            print(f"powerfl: error: {method}: {err}", file=sys.stderr, flush=True)
            return 1
        summaries.append(summary)
        _progress.finish(str(summaries[-1]["run-dir"]))
    if len(summaries) > 1:
        print_comparison(summaries)
    print(f"done in {time.perf_counter() - t0:.0f} s wall time; results:")
    for s in summaries:
        print(f"  {s['method']:<12} {s['run-dir']}")
    print_run_pictures(summaries)
    log_pictures(settings, [s["run-dir"] for s in summaries if s.get("run-dir")])
    sys.stdout.flush()
    failed = [s["method"] for s in summaries if not any_node_trained(s)]
    if failed:
        print(
            f"powerfl: error: no node trained in any round of {', '.join(failed)}; "
            "the reasons are in the run's nodes.jsonl and the log above",
            file=sys.stderr,
        )
        return 1
    line = untrained_line(summaries)
    if line is None:
        return 0
    if settings.allow_untrained_nodes:
        print(f"powerfl: warning: {line} (allowed by allow-untrained-nodes)", file=sys.stderr)
        return 0
    print(
        f"powerfl: error: {line}; the run's summary.json lists them under untrained-nodes; "
        "-c allow-untrained-nodes=true accepts such a run",
        file=sys.stderr,
    )
    return 1


def print_run_pictures(summaries: list[dict[str, Any]]) -> None:
    """The end of ``simulate``: ``timeline.png`` and ``progress.png`` of every method it ran,
    drawn from the runs' records into each run folder, their paths printed
    (``simulations.report_cli``)."""
    from simulations.report_cli import print_simulate_pictures

    print_simulate_pictures(summaries)


def any_node_trained(summary: dict[str, Any]) -> bool:
    """Whether at least one node returned an update in at least one round."""
    return any(n.get("rounds-ok", 0) > 0 for n in summary.get("nodes", {}).values())


def untrained_line(summaries: list[dict[str, Any]]) -> str | None:
    """``node ghost never trained in b1 (QUERY failed: …)``: every node of these runs that
    never trained (a summary's ``untrained-nodes``), each once with its methods and
    reason; None when every node trained."""
    found: dict[tuple[str, str], list[str]] = {}
    for summary in summaries:
        for node in summary.get("untrained-nodes", []):
            if node.get("node") is not None:
                who = str(node["node"])
            else:
                one_of = node.get("one-of")
                who = f"node {node.get('node-id')}"
                who += f" (one of {', '.join(one_of)})" if one_of else ""
            stage = "QUERY failed" if node.get("stage") == "query" else "every TRAIN failed"
            reason = str(node.get("reason", ""))
            reason = reason if len(reason) <= 200 else reason[:199] + "…"
            found.setdefault((who, f"{stage}: {reason}"), []).append(str(summary["method"]))
    if not found:
        return None
    parts = [f"{who} in {', '.join(methods)} ({why})" for (who, why), methods in found.items()]
    count = len({who for who, _ in found})
    noun = "1 node never trained" if count == 1 else f"{count} nodes never trained"
    return f"{noun}: {'; '.join(parts)}"


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``powerfl`` parser. The experiment commands are loaded only when ``argv`` asks
    for them: their module imports PyTorch, and a command must be checked, and fail when
    it is wrong, in well under a second."""
    parser = OnceParser(
        prog="powerfl",
        description="Power-aware federated training for NVIDIA Jetson fleets, on Flower.",
        epilog=PATHS_NOTE,
    )
    parser.add_argument("--version", action="version", version=f"powerfl {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_simulate_parser(sub)
    from fl_client.cli_tools import add_device_commands  # devices, profile, select
    from fl_server.lut_cli import add_lut_commands  # lut list / export / import
    from simulations.pretrain_cli import add_pretrain_command  # pretrain
    from simulations.report_cli import add_report_command  # report

    add_device_commands(sub)
    add_lut_commands(sub)
    add_pretrain_command(sub)
    add_report_command(sub)
    if _command_of(sys.argv[1:] if argv is None else argv) == "experiment":
        from simulations.experiments.cli import add_experiment_commands  # experiment run/report

        add_experiment_commands(sub)
    else:  # listed in --help; the real parser is loaded when the command is used
        sub.add_parser(
            "experiment",
            help="research experiments: run a study from a TOML file, render its report",
        )
    return parser


def add_simulate_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``simulate`` to the ``powerfl`` sub-parser set."""
    p = sub.add_parser(
        "simulate",
        help="run a Flower simulation of a Jetson fleet (digital twins)",
        description="Run the fleet in Flower's simulation engine, once per method, on the "
        "same fleet, data and seeds, and compare. Every setting is checked before the "
        "engine starts. Ctrl-C or SIGTERM stops the run and its engine: exit status 130 or "
        "143, and the finished rounds' records stay. It goes through Flower's Simulation "
        "Runtime (the path behind `flwr run`; --engine in-process on a Flower older than "
        "1.41), which can also join a Ray cluster (--ray-address).",
        epilog=PATHS_NOTE,
    )
    p.add_argument(
        "--methods",
        help="comma-separated methods to run in turn: power-aware, b1, b2, oracle, fixed "
        f"(default: -c method=M if given, else {','.join(DEFAULT_METHODS)}); giving both "
        "--methods and a different -c method is an error",
    )
    p.add_argument(
        "--fleet",
        help="fleet file, or a shipped fleet's name: default (the default), drift, "
        "nano-only, varying-cap",
    )
    p.add_argument("--model", help="cnn | resnet18 | mobilenetv2 (default: cnn)")
    p.add_argument("--rounds", type=int, help="round budget (num-rounds)")
    p.add_argument("--output-dir", help="where run folders go (default: runs)")
    p.add_argument(
        "--run-config",
        "-c",
        action="append",
        metavar="KEY=VALUE",
        help="override any run setting of [tool.flwr.app.config], e.g. -c lr-ref=0.003; "
        "an unknown key is an error",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help="runtime (default with flwr >= 1.41): Flower's Simulation Runtime, the path "
        "behind `flwr run` (a SuperLink of its own in simulation mode); in-process (the "
        "default with an older Flower): Flower's run_simulation in this process, deprecated "
        "from flwr 1.41",
    )
    p.add_argument(
        "--ray-address",
        type=ray_address_arg,
        metavar="HOST:PORT",
        help="join the existing Ray cluster whose head is at HOST:PORT instead of starting "
        "a private Ray; implies --engine runtime. Every Ray node must have powerfl "
        "installed (its ClientApps run there)",
    )
    p.add_argument(
        "--num-cpus",
        type=_share_arg(zero_ok=False),
        default=1.0,
        metavar="N",
        help="CPUs each simulated node reserves in Ray (default: 1; fractions allowed, "
        "whole numbers with --ray-address); one share for every node",
    )
    p.add_argument(
        "--num-gpus",
        type=_share_arg(zero_ok=True),
        default=0.0,
        metavar="N",
        help="share of a GPU each simulated node reserves in Ray (default: 0; e.g. 0.25: "
        "four nodes per GPU); one share for every node",
    )
    p.add_argument("--backend", default="ray", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_simulate)
    return p


#: The rule for relative paths, in ``--help``.
PATHS_NOTE = (
    "Relative paths, given (--fleet, --output-dir, -c fleet=, -c cache-dir=, -c output-dir=, "
    "-c run-dir=, -c dataset=, $FLWR_HOME) or default (runs, .powerfl-cache, .flwr), are "
    "relative to the current directory; a path inside a fleet or experiment file is "
    "relative to that file's folder."
)
#: Commands that run for long and stop cleanly on SIGINT / SIGTERM / SIGHUP.
INTERRUPTIBLE = ("simulate", "experiment")


def _command_of(argv: Sequence[str]) -> str | None:
    """The sub-command named in ``argv`` (its first word that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    except SettingsError as err:
        print(f"powerfl: error: {err}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(argv).parse_args(argv)
    except KeyboardInterrupt:  # while the commands load: nothing has started
        print("powerfl: interrupted before the command started; nothing written", file=sys.stderr)
        return 130
    if args.command not in INTERRUPTIBLE or getattr(args, "experiment_command", "") == "report":
        return _run(args)
    # the clean-up runs inside: a second signal ends it at once, with the same line
    with interruptible(lambda signum: stopped_line(signum, args)):
        try:
            return _run(args)
        except RunInterrupted as intr:
            exit_interrupted(intr, args)


def exit_interrupted(intr: RunInterrupted, args: argparse.Namespace) -> NoReturn:
    """Stop the engine, say in one line what stopped and where its records are, and end
    the process with 128 + the signal's number. ``os._exit``: the run's own threads (the
    ServerApp's, which Flower does not make a daemon) must not keep the process alive."""
    stop_engine()  # the signal handler has set fl_server.results.RUN_STOPPED
    print(stopped_line(intr.signum, args), file=sys.stderr, flush=True)
    sys.stdout.flush()
    from fl_client.devices import safety  # a GPU locked in this process: the run is over

    safety.restore_all()
    os._exit(intr.exit_code)


def stopped_line(signum: int, args: argparse.Namespace) -> str:
    """Once the engine has stopped: the current method's run folders that hold nothing go
    (stopped before its first record), and the line that says what stopped."""
    if _progress is not None:
        _progress.drop_empty_run_dirs()
    return interrupted_line(RunInterrupted(signum), args)


def interrupted_line(intr: RunInterrupted, args: argparse.Namespace) -> str:
    """What was interrupted, where its records are, how to go on: one line."""
    if args.command == "experiment":
        out = _experiment_out(args)
        return (
            f"powerfl experiment run: interrupted by {intr.name}; finished cells are kept in "
            f"{out}; run the same command again to resume from them"
        )
    progress = _progress
    if progress is None:
        return f"powerfl simulate: interrupted by {intr.name} before a run started; no records"
    done = "".join(f"; {m} finished: {d}" for m, d in progress.finished)
    if progress.method is None:  # between two runs, or after the last
        return (
            f"powerfl simulate: interrupted by {intr.name} after {len(progress.finished)} of "
            f"{len(progress.methods)} methods{done}"
        )
    position = f"{len(progress.finished) + 1} of {len(progress.methods)}"
    dirs = progress.run_dirs()
    where = (
        f"its finished rounds are in {dirs[-1]} (no summary.json)"
        if dirs
        else "it had written no records yet"
    )
    return (
        f"powerfl simulate: interrupted by {intr.name} during {progress.method} (method "
        f"{position}); {where}{done}; a simulation does not resume mid-run: run the same "
        f"command again, it reuses the LUTs and r cached in {progress.cache_dir}"
    )


def _experiment_out(args: argparse.Namespace) -> str:
    """The study's output folder: ``--out``, else its default (runs/experiments/NAME-SCALE)."""
    if getattr(args, "out", None):
        return str(Path(args.out).absolute())
    try:
        from simulations.experiments.cli import output_folder, parse_sets
        from simulations.experiments.config import FileOptions

        options = FileOptions(scale=args.scale, seeds=args.seeds, sets=parse_sets(args.set))
        return str(output_folder(args.experiment, options).absolute())
    except Exception:  # the study's own folder rule, when its file reads; else say where
        return f"runs/experiments/<name>-{getattr(args, 'scale', 'mini')}"
