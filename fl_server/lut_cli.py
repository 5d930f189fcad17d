"""``powerfl lut list | export | import``: the server's LUT library from the command line.

An operator profiles one board (``powerfl profile``, or any run with fleet-shared
profiling), ships the table to the server that runs a fleet of that kind, and no node of the
kind profiles again: ``import`` checks the table against the kind it is meant for and names
what differs; ``list`` shows what the library holds (and the files it refuses).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from fl_client.lut import KindKey
from fl_client.preflight import check_input_file, check_writable_dir, check_writable_file
from fl_client.settings import SettingsError, app_defaults, parse_batch_sizes, resolve_path
from fl_server.lut_library import LibraryError, LUTLibrary, TwinModel, read_entry

DEFAULT_LIBRARY = ".powerfl-cache/library"


def add_lut_commands(sub: Any) -> None:
    """Register ``lut list | export | import`` on the ``powerfl`` sub-parsers."""
    p = sub.add_parser(
        "lut",
        help="the server's LUT library: list, export and import one LUT per node kind",
        description="Fleet-shared profiling keeps one LUT per node kind (device, backend, "
        "model, input shape, batch sizes) in the server's library; a run whose fleet has a "
        "kind the library holds does not profile it.",
    )
    p.add_argument(
        "--library",
        default=None,
        help=f"the library folder (a path you type is relative to the current directory; "
        f"default: the run's cache-dir, {DEFAULT_LIBRARY} in the current folder, where "
        "`powerfl simulate` keeps it)",
    )
    lut_sub = p.add_subparsers(dest="lut_command", required=True)
    lut_sub.add_parser("list", help="the kinds the library holds").set_defaults(func=cmd_list)
    e = lut_sub.add_parser("export", help="copy one kind's entry out of the library")
    e.add_argument("kind", help="a library file name, or a unique part of a kind's label")
    e.add_argument("out", type=Path, help="where to write it")
    e.set_defaults(func=cmd_export)
    i = lut_sub.add_parser(
        "import",
        help="add a LUT (a library file, or `powerfl profile` output) for a kind",
        description="The LUT must be of the kind given: device kind, backend, model, "
        "input shape and batch sizes; anything else is refused, naming what differs.",
    )
    i.add_argument("file", type=Path)
    i.add_argument(
        "--replace",
        action="store_true",
        help="import it even when its cells disagree with the kind's measured entry by "
        "more than 15%%, or with the kind's twin by more than 2x in peak power or 4x in "
        "time per sample (an old entry is kept as a backup)",
    )
    i.add_argument("--device", required=True, help="device kind, e.g. jetson-nano")
    i.add_argument("--backend", default="jetson", help="backend (default: jetson)")
    i.add_argument("--model", help="model (default: the run setting)")
    i.add_argument("--batch-sizes", help="B, e.g. 4,8,16 (default: the run setting)")
    i.set_defaults(func=cmd_import)


def _twin(kind: KindKey) -> TwinModel | None:
    """The kind's twin (its device descriptor, when one exists) with the model's FLOPs."""
    from fl_client import model_zoo
    from fl_client.devices.descriptors import available_device_kinds, load_device_spec

    if kind.device_kind not in available_device_kinds():
        return None
    flops = model_zoo.train_flops_per_sample(kind.model_name, tuple(kind.input_shape))
    return TwinModel(load_device_spec(kind.device_kind), flops)


def _expected_kind(args: argparse.Namespace) -> KindKey:
    from fl_client import model_zoo
    from fl_client.devices.descriptors import load_device_spec

    defaults = app_defaults()
    model = args.model or str(defaults.get("model", "cnn"))
    if model not in model_zoo.MODEL_NAMES:
        raise SettingsError(
            f"--model: unknown model {model!r}; allowed: {', '.join(model_zoo.MODEL_NAMES)}"
        )
    batch_sizes = parse_batch_sizes(args.batch_sizes or defaults.get("batch-sizes", ""))
    try:
        freqs = tuple(load_device_spec(args.device).gpu_freqs_mhz)
    except (ValueError, FileNotFoundError) as err:
        raise SettingsError(f"--device: {err}") from None
    return KindKey(
        args.device,
        args.backend,
        model,
        model_zoo.input_shape_for(model),
        tuple(batch_sizes),
        freqs,
    )


def library_dir(typed: str | None) -> Path:
    """The library folder: a typed path against the current directory; by default the app's
    ``cache-dir`` in the current directory, as ``powerfl simulate`` resolves it."""
    if typed is not None:
        return Path(typed).expanduser().absolute()
    return resolve_path(str(app_defaults().get("cache-dir", ".powerfl-cache"))) / "library"


def _library(typed: str | None, *, write: bool) -> LUTLibrary:
    """The library of ``--library`` (or the default); a path that is a file, a typed folder
    that does not exist when only reading (a typo would list an empty library), or a folder
    this process cannot write into when ``write``, is a SettingsError naming ``--library``.
    The default library may be missing: no run has made it yet."""
    root = library_dir(typed)
    if root.exists() and not root.is_dir():
        raise SettingsError(f"--library: {root} is a file, not a folder; give the library folder")
    if typed is not None and not write and not root.exists():
        raise SettingsError(
            f"--library: {root} does not exist; give the library folder (`powerfl lut import` "
            "makes it)"
        )
    if write:
        check_writable_dir(root, "--library")
    return LUTLibrary(root)


def cmd_list(args: argparse.Namespace) -> int:
    library = _library(args.library, write=False)
    good, bad = library.entries()
    if not good and not bad:
        print(f"the LUT library {library.root} is empty")
    for e in good:
        print(
            f"{e.path.name}  {e.kind.label}  {e.lut.cells_profiled} cells  "
            f"{e.lut.grid}  from {e.source or '?'}  saved {e.saved_utc}"
        )
    for line in bad:
        print(f"refused: {line}", file=sys.stderr)
    return 1 if bad else 0


def cmd_export(args: argparse.Namespace) -> int:
    library = _library(args.library, write=False)
    out = check_writable_file(Path(args.out).expanduser().absolute(), "out")
    good, _ = library.entries()
    hits = [e for e in good if args.kind == e.path.name or args.kind in e.kind.label]
    if len(hits) != 1:
        names = ", ".join(e.kind.label for e in hits) or "none"
        raise SettingsError(f"kind: {args.kind!r} matches {len(hits)} entries ({names})")
    read_entry(hits[0].path)  # verified once more: never ship a changed file
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(hits[0].path, out)
    print(f"exported {hits[0].kind.label} to {out}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    check_input_file(
        args.file, "file", "a LUT file (JSON): a library entry or `powerfl profile --out`"
    )
    library = _library(args.library, write=True)
    expected = _expected_kind(args)
    try:
        path, backup = library.import_file(
            args.file, expected=expected, replace=args.replace, twin=_twin(expected)
        )
    except LibraryError as err:
        raise SettingsError(f"lut import: {err}") from None
    print(f"imported {args.file} as {path}")
    if backup is not None:
        print(f"it replaced an entry of the same kind, kept as {backup}")
    return 0
