"""``powerfl devices | profile | select``: the device tools of the command line.

* ``powerfl devices [--restore]`` — what is detected here (``fl_client.devices.cli``).
* ``powerfl profile --model M --batch-sizes B [--p-max-w W] [--cap-margin M]`` — profile
  LUT_time and LUT_power on a device (real or twin), write the LUT (cache file, ``--out``,
  optionally a ``--replay-out`` replay table) and print it as a table.
* ``powerfl select --lut FILE --r R --p-max-w W [--cap-margin M] [--peak-sigma-k K]
  [--tie-tolerance T]`` — Eq. 4 (or a baseline) on a LUT file; prints the chosen knob value
  in its unit (``f* = 1300 MHz``, or ``power limit* = 250 W`` for a power-limit LUT).

``--cap-margin``, ``--peak-sigma-k`` and ``--tie-tolerance`` mirror the run settings of
those names: help, default and check come from their entries in the settings table
(``fl_client.settings_table``), so a node's own cached LUT for 5 W, profiled less its margin,
is selected from with ``select --p-max-w 5``. Caps are parsed and printed as ``Cap``.

The top-level CLI registers all three with ``add_device_commands(subparsers)``; every
handler returns the exit status (0 ok, 1 no feasible configuration or failed restore,
2 bad input or device error) and prints errors as ``powerfl <command>: error: ...``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from fl_client import settings_table
from fl_client.contract import Cap
from fl_client.devices import BACKENDS, POWER_SOURCES, Device, DeviceError, DeviceOptions
from fl_client.devices.base import DeviceInfo, Measurement, Meter, Workload
from fl_client.devices.cli import add_devices_parser
from fl_client.lut_text import cap_text, format_lut, format_selection
from fl_client.selector import METHODS, Objective
from fl_client.settings_table import MODEL_NAMES, RUN, Setting

if TYPE_CHECKING:
    from fl_client.profiler import ProfileOptions

#: The nodes' LUT cache under the run setting ``cache-dir``'s default.
DEFAULT_LUT_CACHE_DIR = f"{RUN['cache-dir'].default}/lut"
#: The run setting ``cap-margin``'s default, so the tools read the LUTs nodes cache.
DEFAULT_CAP_MARGIN: float = RUN["cap-margin"].value


def add_device_commands(subparsers: Any) -> None:
    """Add ``devices``, ``profile`` and ``select`` to an argparse sub-parser set."""
    add_devices_parser(subparsers, check_load=check_load)
    add_profile_parser(subparsers)
    add_select_parser(subparsers)


def _error(command: str, message: object, err: TextIO) -> None:
    print(f"powerfl {command}: error: {message}", file=err)


def add_setting_option(p: argparse.ArgumentParser, setting: Setting, what: str) -> None:
    """``--<key>`` for a run setting the command mirrors: its help is the setting's meaning
    and ``what`` the command does with it, its default the setting's; ``setting_option``
    checks the value as the run setting is checked."""
    default = f"{setting.default:g}" if isinstance(setting.default, float) else setting.default
    help_text = f"{setting.plain_doc()}; {what} (default: {default}, the run setting's)"
    p.add_argument(
        f"--{setting.key}",
        default=setting.default,
        type=str,
        metavar=setting.type_name.upper(),
        help=help_text.replace("%", "%%"),
    )


def setting_option(args: argparse.Namespace, key: str) -> Any:
    """The value of ``--<key>`` (``add_setting_option``), checked by the run setting's check;
    a bad value is a SettingsError (a ValueError) naming the key and what is allowed."""
    setting = RUN[key]
    return setting.parse(getattr(args, setting.field_name))


# ------------------------------------------------------------------------------ profile


def add_profile_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``profile`` to an argparse sub-parser set."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "profile",
        help="profile time and power per (batch size, GPU frequency) and write the LUT",
        description="Lock each GPU frequency, run real training steps of the model at each "
        "batch size and record time per sample, peak and average power (paper §4.1). The LUT "
        "is cached (see --cache-dir), optionally copied to --out and to a replay table, and "
        "printed as a table. With --p-max-w only the cells that matter under that cap are "
        "profiled (efficient mode). The GPU settings found at start are restored at the end, "
        "on Ctrl-C and on SIGTERM.",
    )
    p.add_argument("--model", required=True, help=f"model to profile: {' | '.join(MODEL_NAMES)}")
    p.add_argument(
        "--batch-sizes", required=True, help="comma-separated, ascending, e.g. 4,8,16,32,64,128"
    )
    p.add_argument(
        "--p-max-w",
        default="none",
        help="power cap in W for efficient mode; none (default) profiles the full grid",
    )
    add_setting_option(
        p, RUN["cap-margin"], "efficient mode walks each batch size up while the peak is below it"
    )
    add_setting_option(p, RUN["peak-sigma-k"], "efficient mode's walk judges each cell so")
    p.add_argument(
        "--device",
        "--kind",
        dest="device",
        default="",
        help="device kind, e.g. jetson-nano (needed by the simulated backend; hardware: "
        "detected when empty)",
    )
    _add_device_option_args(p)
    p.add_argument("--warmup-steps", type=int, default=1, help="discarded steps per cell")
    p.add_argument("--steps", type=int, default=3, help="measured steps per cell")
    p.add_argument(
        "--cache-dir",
        default=DEFAULT_LUT_CACHE_DIR,
        help=f"LUT cache folder (default: {DEFAULT_LUT_CACHE_DIR})",
    )
    p.add_argument(
        "--no-cache", action="store_true", help="profile again even if a cached LUT fits"
    )
    p.add_argument("--out", help="also write the LUT (JSON) to this file")
    p.add_argument(
        "--replay-out",
        help="also write the measured cells as a replay table (.csv or .json, see "
        "configs/replay/README.md)",
    )
    p.add_argument("--seed", type=int, default=0, help="simulated: seed of the twin's noise")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="print the LUT as JSON")
    p.set_defaults(func=cmd_profile)
    return p


def _add_device_option_args(p: argparse.ArgumentParser) -> None:
    """``--backend`` and the backends' options of ``powerfl profile``, each the node_config
    key of its name (``device_options`` reads them back)."""
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="default: auto")
    p.add_argument("--sysfs-root", help="jetson: root of the sysfs tree (default: /)")
    p.add_argument(
        "--state-dir",
        help="folder of the GPU state files (default: $POWERFL_STATE_DIR or "
        "~/.cache/powerfl/state)",
    )
    p.add_argument(
        "--power-source", choices=POWER_SOURCES, help="jetson: power reader (default: auto)"
    )
    p.add_argument(
        "--power-rails",
        help="jetson: comma-separated INA3221 rails summed as board power (default: VDD_IN "
        "or POM_5V_IN, else the sum of all rails)",
    )
    p.add_argument("--sample-rate-hz", help="power samples per second (default: 20)")
    p.add_argument("--replay-table", help="replay: the measured table (CSV or JSON)")
    p.add_argument("--nvml-index", help="nvml: GPU index (default: 0)")
    p.add_argument(
        "--lock-clocks",
        help="nvml: true | false | auto (default auto: lock when root, else measure-only)",
    )
    p.add_argument(
        "--knob",
        help="what the grid's second axis sets: frequency (default) | power-limit (nvml, "
        "root) | auto (frequency where clocks can be locked, else the power limit)",
    )
    p.add_argument(
        "--power-limit-step-w",
        help="nvml with --knob power-limit: the grid's step in W from the GPU's highest "
        "limit down (default: 25)",
    )


def device_options(args: argparse.Namespace) -> DeviceOptions:
    """DeviceOptions from the command line (validated as the node_config keys)."""
    config: dict[str, Any] = {}
    for key in (
        "sysfs-root",
        "state-dir",
        "power-source",
        "power-rails",
        "sample-rate-hz",
        "replay-table",
        "nvml-index",
        "lock-clocks",
        "knob",
        "power-limit-step-w",
    ):
        value = getattr(args, key.replace("-", "_"), None)
        if value is not None:
            config[key] = value
    return settings_table.device_options(config)


class RecordingDevice:
    """A Device that keeps the Measurement of every meter opened through it.

    ``powerfl profile`` uses it to compare a device's energy counter (NVML) with the
    integral of the sampled power over the same steps.
    """

    def __init__(self, device: Device) -> None:
        self.device = device
        self.measurements: list[Measurement] = []

    @property
    def info(self) -> DeviceInfo:
        return self.device.info

    @property
    def gpu_freqs_mhz(self) -> tuple[float, ...]:
        return self.device.gpu_freqs_mhz

    def current_gpu_freq_mhz(self) -> float:
        return self.device.current_gpu_freq_mhz()

    def set_gpu_freq_mhz(self, freq_mhz: float) -> None:
        self.device.set_gpu_freq_mhz(freq_mhz)

    def restore(self) -> None:
        self.device.restore()

    def now_s(self) -> float:
        return self.device.now_s()

    @contextmanager
    def measure(self, workload: Workload) -> Iterator[Meter]:
        with self.device.measure(workload) as meter:
            yield meter
        self.measurements.append(meter.measurement)

    def close(self) -> None:
        self.device.close()


def check_load(model: str, batch_size: int) -> tuple[Workload, Callable[[], object]]:
    """The known load of ``powerfl devices --check``: one training step of ``model`` at
    ``batch_size`` on synthetic data (CUDA when available)."""
    if model not in MODEL_NAMES:
        raise ValueError(f"check-model: unknown model {model!r}; allowed: {', '.join(MODEL_NAMES)}")
    from fl_client import task  # torch: only when the check runs
    from fl_client.node import workload_for

    workload = workload_for(model)
    return workload, task.make_train_step(model, workload.input_shape, batch_size)


def energy_check(measurements: Sequence[Measurement]) -> dict[str, float] | None:
    """Energy counter vs integrated sampled power over the measurements that have both.

    Returns ``counter-energy-j``, ``sampled-energy-j`` and ``difference-pct`` (sampled
    relative to the counter), or None when the device has no energy counter.
    """
    pairs = [
        (float(c), float(getattr(m, "sampled_energy_j", 0.0)))
        for m in measurements
        if (c := getattr(m, "counter_energy_j", None)) is not None
    ]
    counter_j = sum(c for c, _ in pairs)
    if not pairs or counter_j <= 0:
        return None
    sampled_j = sum(s for _, s in pairs)
    return {
        "counter-energy-j": counter_j,
        "sampled-energy-j": sampled_j,
        "difference-pct": 100.0 * (sampled_j - counter_j) / counter_j,
    }


def _cells(lut: Any) -> Iterator[tuple[int, int]]:
    for i in range(len(lut.batch_sizes)):
        for j in range(len(lut.freqs_mhz)):
            if not math.isnan(lut.time_per_sample_s[i, j]):
                yield i, j


def lut_to_replay_table(lut: Any, *, power_rail: str, memory_bytes: int, source: str) -> Any:
    """The measured cells of ``lut`` as a replay table (what ``--replay-out`` writes).

    Average power above the sampled peak (possible when energy comes from NVML's counter
    while the sampled power is smoothed) is written as the peak. σ of the per-step peaks
    goes with each row where the LUT recorded it, and the table keeps the LUT's knob.
    """
    from fl_client.devices.replay import ReplayRow, ReplayTable

    rows = []
    for i, j in _cells(lut):
        b = lut.batch_sizes[i]
        peak_w = float(lut.peak_power_w[i, j])
        avg_w = float(lut.avg_power_w[i, j])
        sigma_w = float(lut.peak_sigma_w[i, j])
        rows.append(
            ReplayRow(
                batch_size=b,
                freq_mhz=float(lut.freqs_mhz[j]),
                time_per_step_s=float(lut.time_per_sample_s[i, j]) * b,
                peak_power_w=peak_w,
                avg_power_w=min(avg_w, peak_w) if avg_w > 0 else peak_w,
                peak_power_sigma_w=None if math.isnan(sigma_w) else sigma_w,
            )
        )
    return ReplayTable(
        device=lut.device_kind,
        model=lut.model_name,
        input_shape=tuple(lut.input_shape),
        rows=tuple(rows),
        power_rail=power_rail,
        memory_bytes=memory_bytes or None,
        source=source,
        knob=lut.knob,
    )


def _profile_extra_outputs(args: argparse.Namespace, lut: Any, info: Any) -> list[str]:
    """``--out`` (the LUT) and ``--replay-out`` (a replay table) of ``powerfl profile``."""
    written = []
    if args.out:
        written.append(str(lut.save(args.out)))
    if args.replay_out:
        from fl_client.devices.replay import save_replay_table

        source = (
            f"powerfl profile --backend {info.backend} --model {args.model} on "
            f"{info.kind}, {lut.created_utc}, {lut.warmup_steps} warm-up + {lut.steps} "
            "steps per cell"
        )
        table = lut_to_replay_table(
            lut, power_rail=info.power_rail, memory_bytes=info.memory_bytes, source=source
        )
        written.append(str(save_replay_table(table, args.replay_out)))
    return written


def cmd_profile(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Handler of ``powerfl profile``."""
    out, err = out or sys.stdout, err or sys.stderr
    from fl_client.devices import open_device
    from fl_client.lut_format import LUTFormatError
    from fl_client.profiler import load_or_profile, profile
    from fl_client.settings import SettingsError

    try:
        batch_sizes, profile_options, options, peak_sigma_k = _profile_inputs(args, err)
    except (SettingsError, ValueError) as e:
        _error("profile", e, err)
        return 2

    try:
        device = open_device(args.device, args.backend, seed=args.seed, options=options)
    except (DeviceError, ValueError, OSError, LookupError) as e:
        _error("profile", e, err)
        return 2
    recorder = RecordingDevice(device)
    info = device.info
    try:
        from fl_client import task  # torch: only once the arguments and the device are good
        from fl_client.node import workload_for

        workload = workload_for(args.model)

        def step_factory(b: int) -> Callable[[], object]:
            return task.make_train_step(args.model, workload.input_shape, b)

        if args.no_cache:
            lut = profile(recorder, workload, batch_sizes, step_factory, profile_options)
            from_cache = False
            lut_path = lut.save(lut.key.path(args.cache_dir))
        else:
            lut, from_cache = load_or_profile(
                recorder, workload, batch_sizes, step_factory, args.cache_dir, profile_options
            )
            lut_path = lut.key.path(args.cache_dir)
    except (DeviceError, ValueError, OSError, LUTFormatError) as e:
        _error("profile", e, err)
        return 2
    except KeyboardInterrupt:
        _error("profile", "interrupted; the GPU settings found at start are restored", err)
        return 130
    finally:
        device.close()
    try:
        written = [str(lut_path), *_profile_extra_outputs(args, lut, info)]
    except OSError as e:
        _error("profile", f"cannot write {e.filename or 'the output'}: {e.strerror or e}", err)
        return 2
    check = energy_check(recorder.measurements)
    _print_lut(args, lut, info, peak_sigma_k, out)
    where = "from the cache" if from_cache else "profiled"
    print(f"LUT ({where}) written to: {', '.join(written)}", file=err if args.json else out)
    if check is not None:
        print(
            f"energy check: device counter {check['counter-energy-j']:.2f} J, integrated "
            f"sampled power {check['sampled-energy-j']:.2f} J, difference "
            f"{check['difference-pct']:+.2f}%",
            file=err if args.json else out,
        )
    return 0


def _profile_inputs(
    args: argparse.Namespace, err: TextIO
) -> tuple[list[int], ProfileOptions, DeviceOptions, float]:
    """``powerfl profile``'s batch sizes, profile options, device options and
    ``peak-sigma-k``, each checked before any device opens: a SettingsError or ValueError
    naming the key; the files it would write are checked writable too."""
    from fl_client.preflight import check_writable_dir, check_writable_file
    from fl_client.profiler import ProfileOptions
    from fl_client.settings import parse_batch_sizes

    if args.model not in MODEL_NAMES:
        raise ValueError(f"model: unknown model {args.model!r}; allowed: {', '.join(MODEL_NAMES)}")
    batch_sizes = parse_batch_sizes(args.batch_sizes)
    cap = Cap.parse(args.p_max_w)
    cap_margin = setting_option(args, "cap-margin") if cap.capped else 0.0
    peak_sigma_k = setting_option(args, "peak-sigma-k")
    profile_options = ProfileOptions(
        cap.with_margin(cap_margin),
        warmup_steps=args.warmup_steps,
        steps=args.steps,
        progress=not args.quiet,
        progress_stream=err,
        peak_sigma_k=peak_sigma_k,
    )
    options = device_options(args)
    if args.replay_out and Path(args.replay_out).suffix.lower() not in (".csv", ".json"):
        raise ValueError(f"replay-out: must end in .csv or .json, got {args.replay_out!r}")
    for key, given in (("--out", args.out), ("--replay-out", args.replay_out)):
        if given:  # checked before profiling, whose result they would hold
            check_writable_file(given, key)
    check_writable_dir(args.cache_dir, "--cache-dir")
    return batch_sizes, profile_options, options, peak_sigma_k


def _print_lut(
    args: argparse.Namespace, lut: Any, info: DeviceInfo, peak_sigma_k: float, out: TextIO
) -> None:
    """The profiled LUT: as JSON (``--json``), else its tables and the power sensors."""
    if args.json:
        print(lut.to_json(), file=out)
        return
    print(format_lut(lut, peak_sigma_k=peak_sigma_k), file=out)
    print("", file=out)
    print(f"power rail: {info.power_rail}", file=out)
    print(f"power sensor: {info.sensor.label} ({info.sensor.source})", file=out)
    if info.board_sensor is not None:
        board = info.board_sensor
        print(f"real board's power sensor: {board.label} ({board.source})", file=out)


# ------------------------------------------------------------------------------ select


def add_select_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``select`` to an argparse sub-parser set."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "select",
        help="choose (batch size, GPU knob value) from a LUT under a power cap",
        description="Apply Eq. 4 (power-aware: every measured cell whose peak + k·σ of its "
        "per-step peaks is below P_max less the cap margin is feasible; the least time per "
        "sample × r_b over them, and among cells within the tie tolerance of it the least "
        "energy to accuracy) or a baseline to a LUT written by `powerfl profile`. The knob "
        "is the LUT's: a GPU frequency in MHz, or a GPU power limit in W.",
    )
    p.add_argument("--lut", required=True, help="LUT file (JSON) written by `powerfl profile`")
    p.add_argument(
        "--r",
        required=True,
        help="comma-separated r_b in (0, 1], one per batch size of the LUT (Eq. 3)",
    )
    p.add_argument("--p-max-w", required=True, help="power cap in W, or none")
    add_setting_option(p, RUN["cap-margin"], "Eq. 4 takes cells whose peak is below P_max less it")
    add_setting_option(p, RUN["peak-sigma-k"], "power-aware and oracle judge cells so")
    add_setting_option(p, RUN["tie-tolerance"], "0: the exact minimum")
    p.add_argument("--method", default="power-aware", choices=METHODS, help="default: power-aware")
    p.add_argument(
        "--b1-freq-cap-mhz",
        type=float,
        help="b1/b2: fixed safe frequency (default: the device's band for the cap)",
    )
    p.add_argument("--fixed-batch-size", type=int, help="fixed: the batch size")
    p.add_argument("--fixed-freq-mhz", type=float, help="fixed: the GPU frequency in MHz")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_select)
    return p


def parse_r(text: str) -> list[float]:
    """``"0.9,0.8,1"`` → ``[0.9, 0.8, 1.0]`` (range checked later against the LUT)."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(
            f"r: expected comma-separated numbers in (0, 1], one per batch size; got {text!r}"
        ) from None
    if not values:
        raise ValueError("r: expected comma-separated numbers in (0, 1], one per batch size")
    return values


def cmd_select(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Handler of ``powerfl select``."""
    out, err = out or sys.stdout, err or sys.stderr
    from fl_client.lut import LUT
    from fl_client.lut_format import LUTFormatError
    from fl_client.preflight import check_input_file
    from fl_client.selection import InfeasibleCapError
    from fl_client.selector import Method, select

    try:
        cap = Cap.parse(args.p_max_w)
        cap_margin = setting_option(args, "cap-margin") if cap.capped else 0.0
        rule = Objective(
            peak_sigma_k=setting_option(args, "peak-sigma-k"),
            tie_tolerance=setting_option(args, "tie-tolerance"),
        )
        r = parse_r(args.r)
        path = check_input_file(args.lut, "lut", "a LUT file (JSON) written by `powerfl profile`")
        try:
            lut = LUT.load(path)
        except (LUTFormatError, OSError) as e:
            raise ValueError(f"lut: {path} is not a valid LUT file ({e})") from None
        _check_efficient_lut(lut, cap, cap_margin)
        b1_mhz = args.b1_freq_cap_mhz
        if args.method in ("b1", "b2") and b1_mhz is None:
            b1_mhz = _default_b1_max_freq_mhz(lut.device_kind, cap)
        method = Method(
            args.method,
            rule,
            b1_max_freq_mhz=b1_mhz,
            fixed_batch_size=args.fixed_batch_size,
            fixed_freq_mhz=args.fixed_freq_mhz,
        )
        selection = select(
            method,
            batch_sizes=list(lut.batch_sizes),
            freqs_mhz=list(lut.freqs_mhz),
            tables=lut.tables,
            r=r,
            limit=cap.with_margin(cap_margin),
        )
    except InfeasibleCapError as e:
        _error("select", e, err)
        return 1
    except ValueError as e:
        _error("select", e, err)
        return 2
    if args.json:
        record = {
            **selection.to_dict(),
            "cap-margin": cap_margin,
            "peak-sigma-k": rule.peak_sigma_k,
            "tie-tolerance": rule.tie_tolerance,
        }
        print(json.dumps(record, indent=2), file=out)
    else:
        text = format_selection(selection, r, b1_max_freq_mhz=b1_mhz, cap_margin=cap_margin)
        print(text, file=out)
    return 0


def _check_efficient_lut(lut: Any, cap: Cap, cap_margin: float) -> None:
    """An efficient-mode LUT serves only the cap and cap margin it was profiled for (a full
    grid serves any, one profiled without a cap at the highest frequencies only no cap,
    cells measured on demand nothing); ValueError naming the key and what would fit."""
    if lut.grid == "on-demand":
        raise ValueError(
            "lut: it holds cells a node measured on demand (for pacing), not a LUT to select "
            "from; give the node's selection LUT"
        )
    if lut.grid == "highest" and cap.capped:
        raise ValueError(
            f"p-max-w: {cap.label}, but this LUT was profiled without a cap at each batch size's "
            "highest frequency only; use --p-max-w none, or profile under the cap"
        )
    if not lut.limit.capped:
        return
    lut_cap = Cap.parse(lut.limit.cap_w)
    lut_margin = lut.limit.cap_margin
    other = ", or profile the full grid (powerfl profile without --p-max-w) to select under any cap"
    if cap != lut_cap:
        use = f"--p-max-w {lut_cap.setting}"
        if cap_margin != lut_margin:
            use += f" --cap-margin {lut_margin:g}"
        raise ValueError(
            f"p-max-w: {cap.label} differs from the cap this LUT was profiled for in efficient "
            f"mode ({cap_text(lut_cap, lut_margin)}); use {use}{other}"
        )
    if cap_margin != lut_margin:
        raise ValueError(
            f"cap-margin: {cap_margin:g} differs from the margin this LUT was profiled with in "
            f"efficient mode ({cap_text(lut_cap, lut_margin)}); use --cap-margin "
            f"{lut_margin:g}{other}"
        )


def _default_b1_max_freq_mhz(device_kind: str, cap: Cap) -> float:
    from fl_client.devices.descriptors import DeviceSpecError, load_device_spec

    try:
        spec = load_device_spec(device_kind)
    except (DeviceSpecError, ValueError, OSError) as e:
        raise ValueError(
            f"b1-freq-cap-mhz: no B1 frequency bands known for {device_kind!r} ({e}); give "
            "--b1-freq-cap-mhz"
        ) from None
    return float(spec.b1_max_freq_mhz(cap.watts))  # a cap below every band: ValueError
