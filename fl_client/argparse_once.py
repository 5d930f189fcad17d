"""Options that take one value refuse to be given twice with two values: one rule for every
command line of the project (``powerfl``, ``deploy/``, ``benchmarks/``). Standard library
only, so a script that needs neither Flower nor PyTorch may use it (Python 3.10 too)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # typing.Unpack is Python 3.11's; only the type checker reads it here
    from typing_extensions import Unpack

#: Where ``Once`` notes the options it has seen during one parse (dropped after it).
_SEEN = "_once_seen"


class Once(argparse.Action):
    """An option that takes one value: given twice, an error (argparse keeps the last one
    without a word), unless both give the same value. ``OnceParser`` makes it the default
    action of every command."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen: set[str] = namespace.__dict__.setdefault(_SEEN, set())
        before = getattr(namespace, self.dest, None)
        if self.dest in seen and before != values:
            parser.error(f"{option_string}: given twice ({before} and {values}); give it once")
        seen.add(self.dest)
        setattr(namespace, self.dest, values)


class ParserOptions(TypedDict, total=False):
    """What ``argparse.ArgumentParser`` takes, by keyword: what an ``OnceParser`` (and each
    of its sub-commands' parsers, which ``add_parser`` makes with these) is given."""

    prog: str | None
    usage: str | None
    description: str | None
    epilog: str | None
    parents: Sequence[argparse.ArgumentParser]
    formatter_class: type[argparse.HelpFormatter]
    prefix_chars: str
    fromfile_prefix_chars: str | None
    argument_default: Any
    conflict_handler: str
    add_help: bool
    allow_abbrev: bool
    exit_on_error: bool


class OnceParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose options that take one value are ``Once``: given twice
    with different values, an error naming the option, in every command (its sub-commands'
    parsers are of this class too: ``add_subparsers`` makes them of the parent's class).
    Options meant to repeat (``-c``, ``--set``) append, and their own parsers refuse one key
    given twice. The parsed namespace holds the options only (``vars(args)`` is safe to
    write out)."""

    def __init__(self, **options: Unpack[ParserOptions]) -> None:
        super().__init__(**options)
        self.register("action", None, Once)
        self.register("action", "store", Once)

    # typeshed overloads it for any namespace type; the project passes argparse.Namespace
    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        parsed.__dict__.pop(_SEEN, None)
        return parsed, extras
