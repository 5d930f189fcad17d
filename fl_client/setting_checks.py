"""What a setting allows: value objects that both validate a value and say in words what
they allow (``fl_client.settings_table`` declares one per key).

``check.parse(key, raw)`` returns the value in its parsed form or raises a SettingsError
that names the key and what is allowed; ``check.allowed()`` is the same rule as the
Markdown of ``docs/configuration.md``'s "allowed" column. Free of Flower and PyTorch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from fl_client.contract import Cap, SettingsError, parse_batch_sizes
from fl_client.devices.base import KNOB_SETTINGS, check_knob_setting
from fl_client.names import SAFE_NAME_RULE, check_safe_name


class Check:
    """What a key allows: ``parse`` validates a value (a SettingsError naming the key, else
    the value in its parsed form) and ``allowed`` says the same in words (Markdown)."""

    def parse(self, key: str, raw: object) -> Any:
        return raw

    def allowed(self) -> str:
        return ""


@dataclass(frozen=True)
class AsGiven(Check):
    """Any value, kept as given (the code that reads the key checks it)."""


@dataclass(frozen=True)
class Text(Check):
    """Any value, as a string."""

    def parse(self, key: str, raw: object) -> str:
        return str(raw)


@dataclass(frozen=True)
class Choice(Check):
    """One of ``values`` (a tuple, or a function that gives them when asked: a list that
    another module owns, such as the device kinds of the active descriptor folder)."""

    values: tuple[str, ...] | Callable[[], Iterable[str]]

    def choices(self) -> tuple[str, ...]:
        return tuple(self.values() if callable(self.values) else self.values)

    def parse(self, key: str, raw: object) -> str:
        value, allowed = str(raw), self.choices()
        if value not in allowed:
            raise SettingsError(f"{key}: unknown value {value!r}; allowed: {', '.join(allowed)}")
        return value

    def allowed(self) -> str:
        return " \\| ".join(f"`{v}`" for v in self.choices())


@dataclass(frozen=True)
class Number(Check):
    """A number in (``lo``, ``hi``] (a bool counts as 0 or 1); finite unless ``inf_ok``
    (where ``inf`` means "none", as for ``round-timeout-s``: no timeout)."""

    lo: float
    hi: float = math.inf
    inf_ok: bool = False

    def parse(self, key: str, raw: object) -> float:
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise SettingsError(f"{key}: expected a number, got {raw!r}") from None
        infinite = math.isinf(value) and not self.inf_ok
        if not (self.lo < value <= self.hi) or math.isnan(value) or infinite:
            raise SettingsError(f"{key}: must be {self.allowed()}, got {raw!r}")
        return value

    def allowed(self) -> str:
        if self.hi < math.inf:
            return f"in ({self.lo}, {self.hi}]"
        return f"> {self.lo}" if self.inf_ok else f"a finite number > {self.lo}"


@dataclass(frozen=True)
class Range(Check):
    """A number (not a bool) from ``lo`` to ``hi``, each end open or closed; with
    ``hi = inf`` a finite number."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = True

    def parse(self, key: str, raw: object) -> float:
        try:
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise SettingsError(f"{key}: expected {self.allowed()}, got {raw!r}") from None
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        if isinstance(raw, bool) or not (above and below):
            raise SettingsError(f"{key}: expected {self.allowed()}, got {raw!r}")
        return value

    def allowed(self) -> str:
        if math.isinf(self.hi):
            return f"a finite number {'>' if self.lo_open else '≥'} {self.lo:g}"
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f"a number in {left}{self.lo:g}, {self.hi:g}{right}"


@dataclass(frozen=True)
class Integer(Check):
    """An integer ≥ ``lo`` (``3``, ``3.0``, ``"3"``; not a bool, 1.5 or ``"3.0"``)."""

    lo: int

    def parse(self, key: str, raw: object) -> int:
        bad = SettingsError(f"{key}: expected {self.allowed()}, got {raw!r}")
        if isinstance(raw, bool) or not isinstance(raw, int | float | str):
            raise bad
        try:
            value = int(raw)
        except (ValueError, OverflowError):
            raise bad from None
        if value < self.lo or float(raw) != value:
            raise bad
        return value

    def allowed(self) -> str:
        return f"an integer ≥ {self.lo}"


@dataclass(frozen=True)
class SafeName(Check):
    """A name that becomes part of a file or folder name (``fl_client.names``)."""

    def parse(self, key: str, raw: object) -> str:
        return check_safe_name(raw, key, error=SettingsError)

    def allowed(self) -> str:
        return SAFE_NAME_RULE


@dataclass(frozen=True)
class Flag(Check):
    """true or false (TOML booleans, or the strings ``"true"`` and ``"false"``)."""

    def parse(self, key: str, raw: object) -> bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        raise SettingsError(f"{key}: expected true or false, got {raw!r}")

    def allowed(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class PathText(Check):
    """A path, as a string (empty when unset)."""

    def parse(self, key: str, raw: object) -> str:
        text = raw or ""
        if not isinstance(text, str):
            raise SettingsError(f"{key}: expected {self.allowed()}, got {raw!r}")
        return text.strip()

    def allowed(self) -> str:
        return "a path (a string)"


@dataclass(frozen=True)
class TrackingURI(Check):
    """A tracking store's URI with its scheme (``sqlite:///runs/mlflow.db``,
    ``http://host:5000``), or empty (the default store)."""

    def parse(self, key: str, raw: object) -> str:
        text = raw or ""
        if not isinstance(text, str) or (
            text.strip() and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:\S+", text.strip())
        ):
            raise SettingsError(f"{key}: expected {self.allowed()}, got {raw!r}")
        return text.strip()

    def allowed(self) -> str:
        return "a URI with its scheme (`http://host:5000`, `sqlite:///path/mlflow.db`) or empty"


@dataclass(frozen=True)
class BatchSizes(Check):
    """Batch sizes: ``"4,8,16"`` or ``[4, 8, 16]``, positive and strictly ascending."""

    def parse(self, key: str, raw: object) -> list[int]:
        return parse_batch_sizes(raw, key)

    def allowed(self) -> str:
        return "a comma-separated list of integers"


@dataclass(frozen=True)
class OptionalNumber(Check):
    """Unset as 0, ``""`` or absent (parsed as None), else what ``what`` says: an integer
    ≥ 1 (with ``integer``) or a finite number > 0."""

    what: str
    integer: bool = False

    def parse(self, key: str, raw: object) -> int | float | None:
        if raw in (None, "", 0):
            return None
        value: float = math.nan
        if isinstance(raw, int | float | str) and not isinstance(raw, bool):
            try:
                value = float(raw)
                if self.integer:  # 3, 3.0 and "3"; not "3.0" or 1.5
                    value = int(raw) if value == int(value) else 0
            except (ValueError, OverflowError):
                value = math.nan
        if not (math.isfinite(value) and value > 0 and (value >= 1 or not self.integer)):
            raise SettingsError(f"{key}: expected {self.allowed()}, got {raw!r}")
        return int(value) if self.integer else value

    def allowed(self) -> str:
        return f"{self.what} (0: not set)"


@dataclass(frozen=True)
class DatasetName(Check):
    """A dataset's name (stripped); with ``optional``, empty too (the run's dataset).
    Whether it can be loaded is ``data_splits.check_dataset``'s to say, before any engine starts."""

    optional: bool = False

    def parse(self, key: str, raw: object) -> str:
        if self.optional and raw in (None, ""):
            return ""
        if not isinstance(raw, str) or not raw.strip():
            raise SettingsError(f"{key}: must be {self.allowed()}, got {raw!r}")
        return raw.strip()

    def allowed(self) -> str:
        return "a dataset name or empty" if self.optional else "a dataset name"


@dataclass(frozen=True)
class CapCheck(Check):
    """A power cap (``Cap.parse``): watts > 0, or ``"none"`` (also written ``inf``)."""

    inf_ok: ClassVar[bool] = True  # inf is no cap, as for ``Number(inf_ok=True)``

    def parse(self, key: str, raw: object) -> Cap:
        return Cap.parse(raw, key)

    def allowed(self) -> str:
        return "> 0 W (or 'none' for no cap)"


@dataclass(frozen=True)
class Documented(Check):
    """A value whose parsing needs more than the key (``p-max-schedule``: the fleet file's
    folder); ``text`` says what it allows."""

    text: str

    def allowed(self) -> str:
        return self.text


# ------------------------------------------------------------------------------ backend options


@dataclass(frozen=True)
class OrBlank(Check):
    """``check``'s value, or ``blank`` when unset or blank (``sysfs-root``, ``state-dir``)."""

    check: Check
    blank: Any = None

    def parse(self, key: str, raw: object) -> Any:
        if raw is None or str(raw).strip() == "":
            return self.blank
        return self.check.parse(key, raw)

    def allowed(self) -> str:
        return self.check.allowed()


@dataclass(frozen=True)
class Names(Check):
    """Names, comma-separated or a list (``power-rails``); blank names dropped."""

    def parse(self, key: str, raw: object) -> tuple[str, ...]:
        if isinstance(raw, str):
            names: list[object] = list(raw.split(","))
        elif isinstance(raw, Iterable):
            names = list(raw)
        else:
            raise SettingsError(f"{key}: expected {self.allowed()}, got {raw!r}")
        return tuple(str(n).strip() for n in names if str(n).strip())

    def allowed(self) -> str:
        return "names, comma-separated"


@dataclass(frozen=True)
class AutoFlag(Check):
    """true, false, or auto (unset, blank): None (``lock-clocks``)."""

    def parse(self, key: str, raw: object) -> bool | None:
        text = "" if raw is None else str(raw).lower()
        if text in ("", "auto"):
            return None
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise SettingsError(f"{key}: expected {self.allowed()}, got {raw!r}")

    def allowed(self) -> str:
        return "true, false or auto"


@dataclass(frozen=True)
class KnobName(Check):
    """What the grid's second axis sets (``devices.base.check_knob_setting``: any case,
    unset is ``frequency``)."""

    def parse(self, key: str, raw: object) -> str:
        try:
            return check_knob_setting(raw)
        except ValueError as err:
            raise SettingsError(str(err)) from None

    def allowed(self) -> str:
        return " \\| ".join(f"`{v}`" for v in KNOB_SETTINGS)
