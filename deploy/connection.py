"""Write the SuperLink connection entry that ``flwr run . <connection>`` needs.

Flower 1.41 keeps SuperLink connections in ``$FLWR_HOME/config.toml`` (``~/.flwr`` when
FLWR_HOME is unset)::

    [superlink.lab]
    address = "192.168.1.10:8000"
    root-certificates = "/abs/path/ca.crt"

This script adds or replaces one such entry, keeping every other entry as it is. TLS is
the default; ``--insecure`` writes ``insecure = true`` and says loudly what that means
(only sensible for a SuperLink on 127.0.0.1 that was started with ``--insecure``).

Usage::

    python -m deploy.connection lab --address 192.168.1.10:8000 \\
        --root-certificates deploy/credentials/ca.crt [--default]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli
import tomli_w

from fl_client.argparse_once import OnceParser

INSECURE_WARNING = (
    "WARNING: connection {name!r} is INSECURE: no TLS, traffic to {address} is plain text "
    "and SuperNode authentication cannot be used. Only for a SuperLink on 127.0.0.1 "
    "started with --insecure."
)


def flwr_home() -> Path:
    """Flower's home folder: $FLWR_HOME, else ~/.flwr (as Flower resolves it)."""
    home = os.environ.get("FLWR_HOME")
    return Path(home) if home else Path.home() / ".flwr"


def write_connection(
    name: str,
    address: str,
    *,
    root_certificates: Path | None = None,
    insecure: bool = False,
    make_default: bool = False,
    home: Path | None = None,
) -> Path:
    """Add or replace ``[superlink.<name>]`` in ``<home>/config.toml``; returns the file."""
    if not name or "." in name or " " in name:
        raise ValueError(f"connection name: {name!r} must be a bare word (no dots or spaces)")
    if ":" not in address:
        raise ValueError(f"address: {address!r} must be host:port (e.g. 192.168.1.10:8000)")
    if insecure == (root_certificates is not None):
        raise ValueError("give exactly one of root_certificates (TLS) or insecure=True")
    entry: dict[str, Any] = {"address": address}
    if root_certificates is not None:
        ca = Path(root_certificates).expanduser().resolve()
        if not ca.is_file():
            raise FileNotFoundError(f"root-certificates: {ca} does not exist")
        entry["root-certificates"] = str(ca)  # Flower requires an absolute path
    else:
        entry["insecure"] = True
    path = (home or flwr_home()) / "config.toml"
    data: dict[str, Any] = {}
    if path.is_file():
        with path.open("rb") as fh:
            data = tomli.load(fh)
    superlink = data.setdefault("superlink", {})
    superlink[name] = entry
    if make_default or "default" not in superlink:
        superlink["default"] = name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".toml.tmp")
    with tmp.open("wb") as fh:
        tomli_w.dump(data, fh)
    tmp.replace(path)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = OnceParser(
        prog="python -m deploy.connection",
        description="Add a SuperLink connection to $FLWR_HOME/config.toml for `flwr run`.",
    )
    parser.add_argument("name", help="connection name, used as `flwr run . <name>`")
    parser.add_argument("--address", required=True, help="SuperLink host:port")
    tls = parser.add_mutually_exclusive_group(required=True)
    tls.add_argument("--root-certificates", type=Path, help="the federation's ca.crt")
    tls.add_argument("--insecure", action="store_true", help="no TLS (loopback only)")
    parser.add_argument("--default", action="store_true", help="make it the default")
    args = parser.parse_args(argv)
    path = write_connection(
        args.name,
        args.address,
        root_certificates=args.root_certificates,
        insecure=args.insecure,
        make_default=args.default,
    )
    print(f"connection {args.name!r} → {args.address} written to {path}")
    if args.insecure:
        print(INSECURE_WARNING.format(name=args.name, address=args.address), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
