"""Settings that cannot take effect in a run: refused when typed, named when carried.

A run setting set away from its default that nothing in this run reads changes nothing, and
a user who set it believes it did. The rule (docs/configuration.md):

* typed for this run (``powerfl simulate -c KEY=VALUE``, ``--methods``): refused before
  start, naming the key, why nothing reads it and what to do instead;
* carried by a shared config (the app's pyproject.toml, a run config used for several
  runs, a comparison of methods of which only some read it): named in one warning line at
  start, and the run goes on.

No PyTorch, no Flower: the CLI checks before any engine starts, the server at its start.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fl_client.balance import BALANCE_MODES
from fl_client.settings import DEPRECATED_KEYS, LUT_METHODS, RunSettings, SettingsError
from fl_client.settings_table import RUN

#: The methods that plan a round (``balance``): those that select from a LUT
#: (``fl_client.node.NEEDS_LUT``); B1, B2 and fixed run their fixed rule whatever the plan.
PLANNING_METHODS = LUT_METHODS
#: The round plan's own settings: read only when ``balance`` is not ``off``.
BALANCE_KEYS = ("straggler-work", "round-deadline-s", "critical-r-weight", "deadline-margin")
#: Set while a command that has named the settings without effect runs its runs (their
#: servers, in this process or started from it, inherit it): they do not name them again.
NAMED_ENV = "POWERFL_IDLE_SETTINGS_NAMED"


@dataclass(frozen=True)
class IdleSetting:
    """A setting away from its default that nothing in the run reads, and why."""

    key: str
    value: Any
    why: str
    remedy: str

    @property
    def shown(self) -> str:
        value = f'"{self.value}"' if isinstance(self.value, str) else f"{self.value!r}"
        return f"{self.key} = {value}"


def _default(key: str) -> Any:
    """The run setting's default, parsed (``fl_client.settings_table``)."""
    return RUN[key].value


def _reader(key: str) -> str:
    """The ``balance`` mode that reads ``key`` (one of its ``Mode.reads``)."""
    return next(name for name, m in BALANCE_MODES.items() if key in m.reads)


def _value(settings: RunSettings, key: str) -> Any:
    return getattr(settings, key.replace("-", "_"))


def idle_settings(runs: Sequence[RunSettings]) -> list[IdleSetting]:
    """The settings away from their defaults that none of ``runs`` (the runs of one command,
    each resolved for its method: one run config, so they differ in ``method`` and what
    ``aggregation = "auto"`` resolved to) reads."""
    first = runs[0]
    return [
        *_round_plan_idle(first, [r.method for r in runs]),
        *_fedbuff_idle(runs),
        *_tracking_idle(first),
    ]


#: The settings only ``aggregation = "fedbuff"`` reads.
FEDBUFF_KEYS = (
    "buffer-size",
    "staleness-weight",
    "rate-weight",
    "buffer-step",
    "update-budget",
    "while-waiting",
)


def _aggregations(runs: Sequence[RunSettings]) -> str:
    """``aggregation = "fedavg"``, or per method where the runs differ."""
    found = dict.fromkeys(r.aggregation for r in runs)
    if len(found) == 1:
        return f'aggregation = "{runs[0].aggregation}"'
    return "aggregation " + ", ".join(f'"{r.aggregation}" ({r.method})' for r in runs)


def _fedbuff_idle(runs: Sequence[RunSettings]) -> list[IdleSetting]:
    """The buffer's settings where no run aggregates with ``fedbuff``, and a share of the
    fleet per round (``fraction-train``) where every run does: it has no rounds and keeps
    every node busy."""
    settings = runs[0]
    if all(r.aggregation != "fedbuff" for r in runs):
        return [
            IdleSetting(
                k,
                _value(settings, k),
                f'only aggregation = "fedbuff" reads it, and this run has {_aggregations(runs)}',
                f'set aggregation = "fedbuff" or leave {k} out',
            )
            for k in FEDBUFF_KEYS
            if _value(settings, k) != _default(k)
        ]
    if any(r.aggregation != "fedbuff" for r in runs) or settings.fraction_train == _default(
        "fraction-train"
    ):
        return []
    return [
        IdleSetting(
            "fraction-train",
            settings.fraction_train,
            'aggregation = "fedbuff" has no rounds to sample and keeps every node busy',
            "leave fraction-train out",
        )
    ]


def unread_keys(settings: RunSettings, method: str) -> frozenset[str]:
    """The run settings a run of ``method`` with ``settings`` does not read, whatever their
    values: the buffer's without ``fedbuff``; the round plan's where it plans no round (the
    other balance modes' where it does); ``tracking-uri`` without tracking."""
    keys = set() if settings.aggregation == "fedbuff" else set(FEDBUFF_KEYS)
    modes = dict.fromkeys(k for m in BALANCE_MODES.values() for k in m.reads)
    if settings.balance != "off" and method in PLANNING_METHODS:
        own = BALANCE_MODES[settings.balance].reads
        keys.update(k for k in modes if k not in own)
    else:
        keys.update((*BALANCE_KEYS, *modes))
    if method not in PLANNING_METHODS:
        keys.add("balance")
    if settings.tracking == "none":
        keys.add("tracking-uri")
    return frozenset(keys)


def _tracking_idle(settings: RunSettings) -> list[IdleSetting]:
    """``tracking-uri`` without tracking: nothing logs there."""
    if settings.tracking != "none" or not settings.tracking_uri:
        return []
    return [
        IdleSetting(
            "tracking-uri",
            settings.tracking_uri,
            'tracking = "none" logs nowhere',
            'set tracking = "mlflow" or leave tracking-uri out',
        )
    ]


def _round_plan_idle(settings: RunSettings, methods: Sequence[str]) -> list[IdleSetting]:
    """The round plan's settings (``BALANCE_KEYS``, ``balance``) that no method reads."""
    changed = [k for k in BALANCE_KEYS if _value(settings, k) != _default(k)]
    own = BALANCE_MODES[settings.balance].reads
    others = dict.fromkeys(k for m in BALANCE_MODES.values() for k in m.reads if k not in own)
    other_changed = [k for k in others if _value(settings, k) != _default(k)]
    if settings.balance != "off" and any(m in PLANNING_METHODS for m in methods):
        return [
            IdleSetting(
                k,
                _value(settings, k),
                f'only balance = "{_reader(k)}" reads it, and this run has balance = '
                f'"{settings.balance}"',
                f"leave {k} out",
            )
            for k in other_changed
        ]
    changed += other_changed
    if settings.balance == "off":
        return [
            IdleSetting(
                k,
                _value(settings, k),
                'balance = "off" plans no round, and only the round plan reads it',
                f"set balance (samples, steps or energy) or leave {k} out",
            )
            for k in changed
        ]
    runs = ", ".join(methods)
    why = f"only {' and '.join(PLANNING_METHODS)} plan a round, and this run's methods are {runs}"
    remedy = "add power-aware to --methods or leave {key} out"
    return [
        IdleSetting(k, _value(settings, k), why, remedy.format(key=k))
        for k in ("balance", *changed)
    ]


def partly_idle(settings: RunSettings, methods: Sequence[str]) -> str | None:
    """A comparison of methods of which only some plan a round, with ``balance`` on: the
    others run without the plan, in words; None otherwise."""
    idle = [m for m in methods if m not in PLANNING_METHODS]
    if settings.balance == "off" or not idle or len(idle) == len(methods):
        return None
    return (
        f'balance = "{settings.balance}": {", ".join(idle)} plans no round and runs without '
        f"it (only {' and '.join(PLANNING_METHODS)} plan one)"
    )


def check_effective(runs: Sequence[RunSettings], typed: Collection[str] = ()) -> str | None:
    """Refuse a setting typed for this command (``typed``: its keys, deprecated names too)
    that none of ``runs`` (each resolved for its method) reads: a SettingsError naming it.
    Return one warning line naming every other setting that takes no effect (carried by the
    config), or None."""
    typed_keys = {DEPRECATED_KEYS.get(k, k) for k in typed}
    idle = idle_settings(runs)
    for item in idle:
        if item.key in typed_keys:
            raise SettingsError(
                f"{item.key}: {item.value!r} would take no effect: {item.why}; {item.remedy}"
            )
    parts = [f"{item.shown} ({item.why})" for item in idle]
    partly = partly_idle(runs[0], [r.method for r in runs])
    if partly is not None:
        parts.append(partly)
    if not parts:
        return None
    return "settings that take no effect in this run: " + "; ".join(parts)


@contextlib.contextmanager
def named_by_caller() -> Iterator[None]:
    """Inside the block, the runs' servers leave the warning line of ``check_effective`` to
    the command that started them (``powerfl simulate`` said it once, before its runs)."""
    before = os.environ.get(NAMED_ENV)
    os.environ[NAMED_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(NAMED_ENV, None)
        else:
            os.environ[NAMED_ENV] = before


def named_by_caller_already() -> bool:
    """Whether the command that started this run has named the idle settings already."""
    return bool(os.environ.get(NAMED_ENV))
