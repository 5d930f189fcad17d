"""``powerfl devices [--restore]``: what is detected, frequencies, settings, power rails.

The top-level CLI adds the sub-command with ``add_devices_parser(subparsers)``; its handler
``cmd_devices(args)`` returns the exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from fl_client.devices import (
    BACKENDS,
    DeviceError,
    DeviceOptions,
    detect_backends,
    open_device,
)
from fl_client.devices.safety import restore_leftovers


def add_devices_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``devices`` to an ``argparse`` sub-parser set (``parser.add_subparsers()``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "devices",
        help="show the GPU backends found here, frequencies, settings and power rails",
        description="Show which device backends are available here and, for the one that "
        "would be used, its frequency table, current frequency settings and power rails. "
        "With --restore, put back GPU settings that a killed run left in its state file.",
    )
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="default: auto")
    p.add_argument("--kind", default="", help="device kind, e.g. jetson-nano (default: detected)")
    p.add_argument("--sysfs-root", default="/", help="root of the sysfs tree (default: /)")
    p.add_argument(
        "--state-dir",
        help="folder of the GPU state files (default: $POWERFL_STATE_DIR or "
        "~/.cache/powerfl/state)",
    )
    p.add_argument("--replay-table", help="measured table for the replay backend")
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
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=cmd_devices)
    return p


def restore_command(
    state_dir: str | None, *, force: bool = False, out: TextIO | None = None
) -> int:
    """``powerfl devices --restore``: 0 when every leftover file was restored (or none)."""
    out = out or sys.stdout
    reports = restore_leftovers(state_dir, force=force)
    if not reports:
        print("no leftover GPU state files: nothing to restore", file=out)
        return 0
    for r in reports:
        line = f"{r.status:<9} {r.backend:<7} {r.device_id}  ({r.path})"
        print(line + (f": {r.detail}" if r.detail else ""), file=out)
    return 0 if all(r.status == "restored" for r in reports) else 1


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
        describe = getattr(device, "describe", None)
        if callable(describe):
            report["device"] = describe()
        else:
            info = device.info
            report["device"] = {
                "kind": info.kind,
                "backend": info.backend,
                "gpu-freqs-mhz": list(info.gpu_freqs_mhz),
                "cur-freq-mhz": device.current_gpu_freq_mhz(),
                "memory-bytes": info.memory_bytes,
                "power-rail": info.power_rail,
            }
    finally:
        device.close()
    return report


def _print_text(report: dict[str, Any], out: TextIO) -> None:
    print("backends:", file=out)
    for s in report["backends"]:
        mark = "yes" if s["available"] else "no "
        print(f"  {s['backend']:<10} {mark}  {s['reason']}", file=out)
    if "error" in report:
        print(f"device: {report['error']}", file=out)
        return
    print("device:", file=out)
    for key, value in report["device"].items():
        if key == "gpu-freqs-mhz" or key == "supported-clocks-mhz":
            value = ", ".join(f"{f:g}" for f in value)
        elif key == "rails-w" and isinstance(value, dict):
            value = ", ".join(f"{name} {w:.2f} W" for name, w in value.items())
        print(f"  {key:<14} {value}", file=out)


def cmd_devices(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Handler of ``powerfl devices``."""
    out = out or sys.stdout
    if args.restore:
        return restore_command(args.state_dir, force=args.force, out=out)
    options = DeviceOptions(
        sysfs_root=args.sysfs_root, state_dir=args.state_dir, replay_table=args.replay_table
    )
    report = devices_report(args.kind, args.backend, options)
    if args.json:
        print(json.dumps(report, indent=2, default=str), file=out)
    else:
        _print_text(report, out)
    return 1 if "error" in report else 0
