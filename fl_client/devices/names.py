"""The names the device settings accept, and the one wording for a key nobody knows.

A leaf of ``fl_client.devices``: it imports nothing of the project, so the backends
(``jetson``, ``simulated``, …) read these from here and never from the package's
``__init__``, which opens them (``open_device``); the package re-exports every name.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

BACKENDS = ("auto", "simulated", "jetson", "nvml", "replay")
# What ``auto`` tries, in order: real hardware first, the twin last.
AUTO_ORDER = ("jetson", "nvml", "replay", "simulated")
POWER_SOURCES = ("auto", "sysfs", "jtop")  # jetson power readers: INA3221 sysfs, jtop service


def key_hint(key: str, known: Iterable[str]) -> str:
    """`` (did you mean cap-margin?)`` for the nearest known key, else ``; known keys: …``."""
    names = sorted(known)
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else f"; known keys: {', '.join(names)}"


def unknown_key_message(key: str, known: Iterable[str], where: str) -> str:
    """``<where>: unknown key 'cap-margn' (did you mean cap-margin?)``.

    The one rule for unknown keys everywhere (run settings, fleet entries, node_config,
    device options, device descriptors): refused, naming the key and the nearest known one.
    """
    return f"{where}: unknown key {key!r}{key_hint(key, known)}"
