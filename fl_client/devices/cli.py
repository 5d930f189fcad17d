"""``powerfl devices [--restore | --check]``: what is detected, frequencies, settings, rails.

``--check`` runs the power-sensor self-test (``fl_client.devices.check``) on a few seconds
of a known load, measure only. The load (a training step) comes from the caller that adds
the sub-command (``add_devices_parser(subparsers, check_load=...)``): this package knows no
models.

The top-level CLI adds the sub-command with ``add_devices_parser(subparsers)``; its handler
``cmd_devices(args)`` returns the exit status: 0 ok, 1 a device or restore failed, 2 bad
input (e.g. a ``--state-dir`` that does not exist).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

from fl_client.devices import (
    BACKENDS,
    GPU_FREQ_MHZ,
    POWER_SOURCES,
    DeviceError,
    DeviceInfo,
    DeviceOptions,
    Workload,
    detect_backends,
    open_device,
)
from fl_client.devices.check import (
    EmulatedCheck,
    SensorCheck,
    SensorCheckError,
    check_emulated,
    check_sensor,
    check_text,
    emulated_text,
    is_emulated,
)
from fl_client.devices.safety import STATE_DIR_ENV, resolve_state_dir, restore_leftovers

EXIT_BAD_INPUT = 2


#: ``check_load(model, batch_size)`` → (workload, one training step): the known load.
CheckLoad = Callable[[str, int], tuple[Workload, Callable[[], object]]]
CHECK_MODEL = "resnet18"
CHECK_BATCH_SIZE = 128
CHECK_SECONDS = 5.0


def add_devices_parser(
    subparsers: Any, check_load: CheckLoad | None = None
) -> argparse.ArgumentParser:
    """Add ``devices`` to an ``argparse`` sub-parser set (``parser.add_subparsers()``);
    ``check_load`` builds the known load of ``--check`` (without it ``--check`` says so)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "devices",
        help="show the GPU backends found here, frequencies, settings and power rails",
        description="Show which device backends are available here and, for the one that "
        "would be used, its frequency table, current frequency settings and power rails. "
        "With --restore, put back GPU settings that a killed run left in its state file.",
    )
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="default: auto")
    p.add_argument("--kind", default="", help="device kind, e.g. jetson-nano (default: detected)")
    p.add_argument(
        "--sysfs-root",
        default="/",
        help="the folder holding sys/ and proc/ (default: /), or the sysfs mount itself",
    )
    p.add_argument(
        "--state-dir",
        help="folder of the GPU state files (default: $POWERFL_STATE_DIR or "
        "~/.cache/powerfl/state)",
    )
    p.add_argument("--replay-table", help="measured table for the replay backend")
    p.add_argument(
        "--power-source",
        default="auto",
        choices=POWER_SOURCES,
        help="jetson power reader: INA3221 sysfs, the jtop service, or auto (default)",
    )
    p.add_argument(
        "--power-rails",
        default="",
        metavar="RAIL[,RAIL...]",
        help="jetson: the rail(s) whose summed power the cap applies to (node-config "
        "power-rails); default: the board input rail (VDD_IN or POM_5V_IN), else every "
        "rail. The rails found are listed under rails-w",
    )
    p.add_argument(
        "--restore",
        action="store_true",
        help="put back the GPU settings recorded in leftover state files, then exit",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with --restore: also restore files whose writing process still seems alive",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="power-sensor self-test: a few seconds of a known load, measure only (no clock "
        "or power limit is changed); reports the sensor's update period, sampled vs counter "
        "energy, peak/average, the clock during the load and whether it can enforce a cap. "
        "Exits 1 without usable power readings. On the twin or a replay table (no sensor) "
        "it reports the model's or the table's figures for the load instead, in seconds",
    )
    p.add_argument(
        "--check-seconds",
        type=float,
        default=CHECK_SECONDS,
        help=f"with --check: seconds of load measured (default: {CHECK_SECONDS:g})",
    )
    p.add_argument(
        "--check-model",
        default=CHECK_MODEL,
        help=f"with --check: the model trained as the load (default: {CHECK_MODEL})",
    )
    p.add_argument(
        "--check-batch-size",
        type=int,
        default=CHECK_BATCH_SIZE,
        help=f"with --check: its batch size (default: {CHECK_BATCH_SIZE})",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_devices, check_load=check_load)
    return p


def check_command(
    args: argparse.Namespace, options: DeviceOptions, out: TextIO, err: TextIO
) -> int:
    """``powerfl devices --check``: 0 with a usable sensor, 1 without power readings (or a
    device that cannot be opened), 2 bad input."""
    load: CheckLoad | None = getattr(args, "check_load", None)
    if load is None:
        print("devices: --check needs the training load of the powerfl command", file=err)
        return EXIT_BAD_INPUT
    if not (args.check_seconds > 0) or args.check_batch_size < 1:
        print(
            "devices: --check-seconds must be > 0 and --check-batch-size ≥ 1, got "
            f"{args.check_seconds!r} and {args.check_batch_size!r}",
            file=err,
        )
        return EXIT_BAD_INPUT
    measure_only = dataclasses.replace(options, lock_clocks=False, knob=GPU_FREQ_MHZ.setting)
    try:
        device = open_device(args.kind, args.backend, options=measure_only)
    except (DeviceError, ValueError, ImportError, FileNotFoundError) as e:
        print(f"devices: {type(e).__name__}: {e}", file=err)
        return 1
    result: SensorCheck | EmulatedCheck
    try:
        workload, step = load(args.check_model, args.check_batch_size)
        if is_emulated(device):  # no sensor: the backend's figures, no step on the host
            result = check_emulated(
                device, workload, args.check_batch_size, seconds=args.check_seconds
            )
        else:
            result = check_sensor(
                device, workload, args.check_batch_size, step, seconds=args.check_seconds
            )
    except SensorCheckError as e:
        print(f"devices: sensor check failed: {e}", file=err)
        return 1
    except (DeviceError, ValueError) as e:
        print(f"devices: {type(e).__name__}: {e}", file=err)
        return 1
    finally:
        device.close()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str), file=out)
    else:
        lines = emulated_text(result) if isinstance(result, EmulatedCheck) else check_text(result)
        print("\n".join(lines), file=out)
    return 0


def restore_command(
    state_dir: str | None,
    *,
    force: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``powerfl devices --restore``: 0 when every leftover file was restored (or none).

    A state folder the user named (``--state-dir`` or ``$POWERFL_STATE_DIR``) that does not
    exist is an error (exit 2): a mistyped path must not read as "nothing to restore".
    """
    out = out or sys.stdout
    folder = resolve_state_dir(state_dir)
    if not folder.is_dir():
        source = "--state-dir" if state_dir is not None else f"${STATE_DIR_ENV}"
        named = state_dir is not None or os.environ.get(STATE_DIR_ENV, "").strip()
        if named or folder.exists():
            what = "is not a directory" if folder.exists() else "does not exist"
            print(
                f"devices --restore: state directory {folder} ({source}) {what}; nothing was "
                "restored. Give the folder the runs wrote their state files to.",
                file=err or sys.stderr,
            )
            return EXIT_BAD_INPUT
    reports = restore_leftovers(folder, force=force)
    if not reports:
        print(f"no leftover GPU state files in {folder}: nothing to restore", file=out)
        return 0
    for r in reports:
        line = f"{r.status:<9} {r.backend:<7} {r.device_id}  ({r.path})"
        print(line + (f": {r.detail}" if r.detail else ""), file=out)
    return 0 if all(r.status == "restored" for r in reports) else 1


def _b1_bands_text(info: DeviceInfo) -> str:
    if not info.b1_bands:
        return "none known (B1 runs at the highest frequency)"
    return ", ".join(band.label for band in info.b1_bands)


def devices_report(kind: str, backend: str, options: DeviceOptions) -> dict[str, Any]:
    """Backends found here, and the description of the device ``backend`` opens."""
    report: dict[str, Any] = {
        "backends": [
            {"backend": s.backend, "available": s.available, "reason": s.reason}
            for s in detect_backends(kind, options)
        ]
    }
    try:
        device = open_device(kind, backend, options=options)
    except (DeviceError, ValueError, ImportError, FileNotFoundError) as err:
        report["error"] = f"{type(err).__name__}: {err}"
        return report
    try:
        info = device.info
        describe = getattr(device, "describe", None)
        if callable(describe):
            report["device"] = describe()
        else:
            report["device"] = {
                "kind": info.kind,
                "backend": info.backend,
                "gpu-freqs-mhz": list(info.knob_values),
                "cur-freq-mhz": device.current_knob_value(),
                "memory-bytes": info.memory_bytes,
                "power-rail": info.power_rail,
            }
        report["device"]["b1-bands"] = _b1_bands_text(info)
    finally:
        device.close()
    if options.power_rails and info.backend != "jetson":
        report["error"] = (
            f"power-rails: only the jetson backend sums chosen rails; the {info.backend} "
            f"backend reports {info.power_rail}"
        )
    return report


def _print_text(report: dict[str, Any], out: TextIO) -> None:
    print("backends:", file=out)
    for s in report["backends"]:
        mark = "yes" if s["available"] else "no "
        print(f"  {s['backend']:<10} {mark}  {s['reason']}", file=out)
    if "device" in report:
        print("device:", file=out)
        for key, value in report["device"].items():
            if key in ("gpu-freqs-mhz", "supported-clocks-mhz", "power-limits-w"):
                value = ", ".join(f"{f:g}" for f in value)
            elif key == "power-limit-range-w":
                value = f"{value[0]:g}–{value[1]:g} W  (the GPU's allowed range)"
            elif key in ("power-limit-w", "power-limit-default-w"):
                value = f"{value:g} W"
            elif key == "rails-w" and isinstance(value, dict):
                value = ", ".join(f"{name} {w:.2f} W" for name, w in value.items())
            elif key == "unreadable-rails":
                if not value:
                    continue
                value = "; ".join(value)
            elif key == "power-rail" and report["device"].get("backend") == "jetson":
                value = f"{value}  (the cap applies to it; choose with --power-rails)"
            print(f"  {key:<16} {value}", file=out)
    if "error" in report:
        print(f"device: {report['error']}", file=out)


def cmd_devices(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Handler of ``powerfl devices``."""
    out = out or sys.stdout
    if args.restore:
        return restore_command(args.state_dir, force=args.force, out=out, err=err)
    rails = tuple(r.strip() for r in str(args.power_rails or "").split(",") if r.strip())
    options = DeviceOptions(
        sysfs_root=args.sysfs_root,
        state_dir=args.state_dir,
        replay_table=args.replay_table,
        power_source=args.power_source,
        power_rails=rails,
    )
    if getattr(args, "check", False):
        return check_command(args, options, out, err or sys.stderr)
    report = devices_report(args.kind, args.backend, options)
    if args.json:
        print(json.dumps(report, indent=2, default=str), file=out)
    else:
        _print_text(report, out)
    return 1 if "error" in report else 0
