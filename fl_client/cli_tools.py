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
from typing import Any, TextIO

from fl_client.contract import Cap
from fl_client.devices import BACKENDS, POWER_SOURCES, Device, DeviceError, DeviceOptions
from fl_client.devices.base import GPU_FREQ_MHZ, DeviceInfo, Knob, Measurement, Meter, Workload
from fl_client.devices.cli import add_devices_parser
from fl_client.selector import METHODS, PEAK_SIGMA_K, Objective
from fl_client.settings_table import MODEL_NAMES, RUN, Setting

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


def knob_symbol(knob: Knob) -> str:
    """How the knob is written in the tables and the choice: ``f`` for the GPU frequency,
    else its label without "GPU " (``power limit``)."""
    return "f" if knob == GPU_FREQ_MHZ else knob.label.removeprefix("GPU ")


def _under(cap: Cap, cap_margin: float) -> str:
    """``"P_max 5 W"`` or ``"P_max 5 W less cap-margin 5% (4.75 W)"``."""
    text = f"P_max {cap.label}"
    if cap.capped and cap_margin > 0:
        text += (
            f" less cap-margin {100 * cap_margin:g}% ({cap.with_margin(cap_margin).limit_w:.4g} W)"
        )
    return text


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
    return DeviceOptions.from_config(config)


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


def format_lut(lut: Any, p_max_w: float | None = None, peak_sigma_k: float = PEAK_SIGMA_K) -> str:
    """The tables of a LUT as text: rows = batch sizes, columns = the knob's values (MHz).

    Cells not profiled (efficient mode) show ``-``; cells that are not feasible by the
    selector's rule (peak + ``peak_sigma_k``·σ of the per-step peaks) against what
    efficient mode compared them with (the LUT's cap less its cap margin), or against
    ``p_max_w`` when given, are marked ``*`` in the peak power table. σ is printed when the
    LUT recorded it.
    """
    import numpy as np

    from fl_client.selector import feasible_cells

    cap = p_max_w if p_max_w is not None else (lut.limit.limit_w if lut.limit.capped else None)
    sigma_w = lut.peak_sigma_w
    has_sigma = bool(np.isfinite(sigma_w).any())
    infeasible = ~feasible_cells(lut.peak_power_w, cap, peak_sigma_w=sigma_w,
                                 peak_sigma_k=peak_sigma_k)  # fmt: skip
    heads = [f"{f:g}" for f in lut.freqs_mhz]
    width = max(8, *(len(h) + 1 for h in heads))

    corner = f"b \\ {lut.knob.unit}"

    def block(title: str, table: Any, fmt: Callable[[float], str], mark: bool) -> list[str]:
        lines = [title, f"{corner:>8}" + "".join(f"{h:>{width}}" for h in heads)]
        for i, b in enumerate(lut.batch_sizes):
            cells = []
            for j in range(len(lut.freqs_mhz)):
                x = float(table[i, j])
                text = "-" if math.isnan(x) else fmt(x)
                if mark and cap is not None and not math.isnan(x) and infeasible[i, j]:
                    text += "*"
                cells.append(f"{text:>{width}}")
            lines.append(f"{b:>8}" + "".join(cells))
        return lines

    lut_cap = Cap.parse(lut.p_max_w)
    under = _under(lut_cap, lut.cap_margin)
    mode = "full grid" if not lut_cap.capped else f"efficient mode for {under}"
    if lut.grid in ("highest", "on-demand"):
        mode = {"highest": "no cap, highest frequency per b", "on-demand": "cells on demand"}[
            lut.grid
        ]
    windows = np.isfinite(lut.window_s).any()
    at_least = "≥ " if windows else ""
    lines = [
        f"LUT {lut.device_kind} ({lut.backend}) {lut.workload_key}: {mode}, "
        f"{lut.cells_profiled} cells, {lut.warmup_steps} warm-up + {at_least}{lut.steps} steps "
        f"per cell, profiling took {lut.profile_time_s:.1f} s and {lut.profile_energy_j:.1f} J",
        "",
    ]
    lines += block("time per sample (ms)", lut.time_per_sample_s, lambda x: f"{1e3 * x:.4g}", False)
    lines.append("")
    robust = f"peak + {peak_sigma_k:g}·σ " if has_sigma and peak_sigma_k > 0 else ""
    if cap is None:
        mark_title = ""
    elif p_max_w is not None:
        mark_title = f"; * = {robust}not below P_max {Cap.parse(p_max_w).label}"
    else:
        mark_title = f"; * = {robust}not below {under}"
    lines += block("peak power (W)" + mark_title, lut.peak_power_w, lambda x: f"{x:.2f}", True)
    lines.append("")
    lines += block("average power (W)", lut.avg_power_w, lambda x: f"{x:.2f}", False)
    if has_sigma:
        lines.append("")
        title = "σ of the per-step peak power (W; - = not profiled or not recorded)"
        lines += block(title, sigma_w, lambda x: f"{x:.3f}", False)
    return "\n".join(lines + _cell_window_lines(lut, block))


def _cell_window_lines(lut: Any, block: Callable[..., list[str]]) -> list[str]:
    """How each cell was measured (power samples, window, settled, the real board's
    window), where the LUT recorded it, and the profiling time the board's windows imply."""
    import numpy as np

    lines: list[str] = []
    if np.isfinite(lut.power_samples).any():
        lines += [
            "",
            *block("power samples per cell", lut.power_samples, lambda x: f"{x:.0f}", False),
        ]
    if np.isfinite(lut.window_s).any():
        unsettled = lut.settled == 0
        title = "measured window per cell (s)"
        if unsettled.any():
            title += f"; ~ = unsettled: stopped at the cap ({int(unsettled.sum())} cells)"
        marked = np.where(unsettled, -1.0 - np.asarray(lut.window_s), lut.window_s)
        lines += [
            "",
            *block(title, marked, lambda x: f"{-1 - x:.3g}~" if x < 0 else f"{x:.3g}", False),
        ]
    if np.isfinite(lut.needed_window_s).any():
        title = "window the real board's power sensor would need per cell (s)"
        lines += ["", *block(title, lut.needed_window_s, lambda x: f"{x:.3g}", False)]
    board_s = lut.board_profile_time_s
    if board_s is not None:
        lines += [
            "",
            f"on the real board, profiling these cells would take about {board_s:.1f} s "
            f"(sensor windows; {lut.backend} took {lut.profile_time_s:.1f} s, report only)",
        ]
    return lines


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
    from fl_client.lut import LUTFormatError
    from fl_client.profiler import ProfileOptions, load_or_profile, profile
    from fl_client.settings import (
        SettingsError,
        check_writable_dir,
        check_writable_file,
        parse_batch_sizes,
    )

    try:
        if args.model not in MODEL_NAMES:
            raise ValueError(
                f"model: unknown model {args.model!r}; allowed: {', '.join(MODEL_NAMES)}"
            )
        batch_sizes = parse_batch_sizes(args.batch_sizes)
        cap = Cap.parse(args.p_max_w)
        cap_margin = setting_option(args, "cap-margin") if cap.capped else 0.0
        peak_sigma_k = setting_option(args, "peak-sigma-k")
        profile_options = ProfileOptions(
            p_max_w=cap.to_record(),
            cap_margin=cap_margin,
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
    if args.json:
        print(lut.to_json(), file=out)
    else:
        print(format_lut(lut, peak_sigma_k=peak_sigma_k), file=out)
        print("", file=out)
        print(f"power rail: {info.power_rail}", file=out)
        print(f"power sensor: {info.sensor.label} ({info.sensor.source})", file=out)
        if info.board_sensor is not None:
            board = info.board_sensor
            print(f"real board's power sensor: {board.label} ({board.source})", file=out)
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


def format_selection(
    selection: Any,
    r: Sequence[float],
    *,
    b1_freq_cap_mhz: float | None = None,
    cap_margin: float = 0.0,
) -> str:
    """The choice and the candidate set (Eq. 4's C) as text; the knob named in its unit
    (``f* = 921.6 MHz``, ``power limit* = 250 W``)."""
    knob = getattr(selection, "knob", GPU_FREQ_MHZ)
    symbol, unit = knob_symbol(knob), knob.unit
    if selection.method in ("power-aware", "oracle"):
        under = f" under {_under(Cap.parse(selection.p_max_w), cap_margin)}"
    elif b1_freq_cap_mhz is not None:
        under = f" at the fixed frequency cap {b1_freq_cap_mhz:g} {unit}"
    else:
        under = ""
    head = f"{symbol} {unit}"
    lines = [
        f"{selection.method}: b* = {selection.batch_size}, {symbol}* = "
        f"{selection.freq_mhz:g} {unit}{under}; predicted "
        f"{1e3 * selection.time_per_sample_s:.4g} ms/sample, peak {selection.peak_power_w:.2f} W",
        "",
        f"{'':2}{'b':>6} {head:>9} {'ms/sample':>10} {'peak W':>8} {'r':>7} {'score':>10}",
    ]
    r_by_b = dict(zip([c.batch_size for c in selection.candidates], r, strict=False))
    for c in selection.candidates:
        chosen = "*" if c.batch_size == selection.batch_size else " "
        f = "-" if c.freq_mhz is None else f"{c.freq_mhz:g}"
        t = "-" if math.isnan(c.time_per_sample_s) else f"{1e3 * c.time_per_sample_s:.4g}"
        pw = "-" if math.isnan(c.peak_power_w) else f"{c.peak_power_w:.2f}"
        rb = r_by_b.get(c.batch_size)
        rs = "-" if rb is None else f"{rb:.3g}"
        sc = "-" if math.isnan(c.score) else f"{1e3 * c.score:.4g}"
        lines.append(f"{chosen:2}{c.batch_size:>6} {f:>9} {t:>10} {pw:>8} {rs:>7} {sc:>10}")
    lines.append("")
    lines.append("score = ms/sample × r_b (smaller trains to accuracy sooner); * = chosen")
    return "\n".join(lines)


def cmd_select(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Handler of ``powerfl select``."""
    out, err = out or sys.stdout, err or sys.stderr
    from fl_client.lut import LUT, LUTFormatError
    from fl_client.selector import InfeasibleCapError, Tables, select
    from fl_client.settings import check_input_file

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
        b1_cap = args.b1_freq_cap_mhz
        if args.method in ("b1", "b2") and b1_cap is None:
            b1_cap = _default_b1_cap_mhz(lut.device_kind, cap)
        selection = select(
            args.method,
            batch_sizes=list(lut.batch_sizes),
            freqs_mhz=list(lut.freqs_mhz),
            tables=Tables(
                lut.time_per_sample_s,
                lut.peak_power_w,
                lut.avg_power_w,
                lut.peak_sigma_w,
                lut.knob,
            ),
            r=r,
            p_max_w=cap.with_margin(cap_margin),
            objective=rule,
            b1_freq_cap_mhz=b1_cap,
            fixed_batch_size=args.fixed_batch_size,
            fixed_freq_mhz=args.fixed_freq_mhz,
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
        text = format_selection(selection, r, b1_freq_cap_mhz=b1_cap, cap_margin=cap_margin)
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
    if lut.p_max_w is None:
        return
    lut_cap = Cap.parse(lut.p_max_w)
    other = ", or profile the full grid (powerfl profile without --p-max-w) to select under any cap"
    if cap != lut_cap:
        use = f"--p-max-w {lut_cap.setting}"
        if cap_margin != lut.cap_margin:
            use += f" --cap-margin {lut.cap_margin:g}"
        raise ValueError(
            f"p-max-w: {cap.label} differs from the cap this LUT was profiled for in efficient "
            f"mode ({_under(lut_cap, lut.cap_margin)}); use {use}{other}"
        )
    if cap_margin != lut.cap_margin:
        raise ValueError(
            f"cap-margin: {cap_margin:g} differs from the margin this LUT was profiled with in "
            f"efficient mode ({_under(lut_cap, lut.cap_margin)}); use --cap-margin "
            f"{lut.cap_margin:g}{other}"
        )


def _default_b1_cap_mhz(device_kind: str, cap: Cap) -> float:
    from fl_client.devices.descriptors import DeviceSpecError, load_device_spec

    try:
        spec = load_device_spec(device_kind)
    except (DeviceSpecError, ValueError, OSError) as e:
        raise ValueError(
            f"b1-freq-cap-mhz: no B1 frequency bands known for {device_kind!r} ({e}); give "
            "--b1-freq-cap-mhz"
        ) from None
    return float(spec.b1_freq_cap_mhz(cap.watts))  # a cap below every band: ValueError
