"""The one rule for a name that becomes part of a file or folder name.

A node's name, a device kind, a backend, a model, a study: each ends up in a path on some
disk (a node's cache folder, the server's LUT library, a study's output folder). Such a name
is checked where it is read (a fleet file, a node config, an experiment file) and again
where it arrives over the wire (a node's QUERY reply) and where a path is built from it, so
a faulty or hostile node cannot write outside the folder meant for it. No project import:
every layer may use it.
"""

from __future__ import annotations

import re

#: A safe name: a letter or digit, then up to 63 letters, digits, ``.``, ``_`` or ``-``
#: (no ``/``, no ``\``, no space, never empty), and no ``..`` anywhere.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: What ``SAFE_NAME`` allows, in words (for error messages and the docs).
SAFE_NAME_RULE = (
    "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit, without '..'"
)


class UnsafeNameError(ValueError):
    """A name that would become part of a path is not a safe name (``SAFE_NAME``)."""


def is_safe_name(value: object) -> bool:
    """Whether ``value`` is a string that matches ``SAFE_NAME`` and holds no ``..``."""
    return isinstance(value, str) and bool(SAFE_NAME.fullmatch(value)) and ".." not in value


def check_safe_name(
    value: object, key: str, where: str = "", error: type[ValueError] = UnsafeNameError
) -> str:
    """``value`` when it is a safe name; else ``error`` (the caller's own, such as a
    SettingsError; an ``UnsafeNameError`` by default) naming ``where``, ``key``, the value
    and what is allowed."""
    if not is_safe_name(value):
        raise error(
            f"{where}{': ' if where else ''}{key}: {value!r} cannot be used as a name: it "
            f"becomes part of a file or folder name; allowed: {SAFE_NAME_RULE}"
        )
    assert isinstance(value, str)
    return value
