"""Experiment files (TOML): the reading, validation and scales every study shares.

An experiment file has one ``[experiment]`` table with the study's settings and optional
``[scale.mini]`` / ``[scale.paper]`` tables that override any of them for that scale.
Every key is kebab-case; an unknown key, a bad value or an empty sweep is an error that
names the key and what is allowed, raised before any training starts. Each study declares
its own keys and defaults (``*_config.py``) and reads them through ``Fields``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_client.devices import key_hint
from fl_client.names import UnsafeNameError, check_safe_name
from fl_client.power import PowerLimit
from fl_client.selector_inputs import validate_batch_sizes
from fl_client.settings import fleet_path, tomllib
from fl_client.shipped import shipped_file, shipped_names

SCALES = ("mini", "paper")
#: Methods of the studies, in report order.
STUDY_METHODS = ("b1", "b2", "power-aware", "oracle")
METHOD_LABELS = {
    "b1": "Baseline 1",
    "b2": "Baseline 2",
    "power-aware": "Ours",
    "oracle": "Oracle (fastest config.)",
}
#: Where a study's training runs may execute ("auto": CUDA when available, else the CPU).
TORCH_DEVICES = ("cpu", "cuda", "auto")
#: Keys of the studies that are paths. Given with ``--set`` (typed by a user) a relative one
#: is made absolute against the current directory, as on every command line; a fleet
#: written in an experiment file is relative to the file's folder, or a shipped fleet's
#: name (``fl_client.settings.fleet_path``).
PATH_KEYS = ("fleet", "varying-cap-fleet", "drift-fleet", "data-root", "initial-weights")
FLEET_KEYS = ("fleet", "varying-cap-fleet", "drift-fleet")
#: Keys that are lists of fleets, each resolved as a fleet key is.
FLEET_LIST_KEYS = ("balance-fleets", "fleets")


class ExperimentConfigError(ValueError):
    """An experiment file that cannot be run; the message names the file and the key."""


@dataclass(frozen=True)
class FileOptions:
    """How an experiment file is read: the scale, then the command's overrides."""

    scale: str = "mini"
    seeds: int | None = None  # ``--seeds``
    sets: Mapping[str, Any] | None = None  # ``--set KEY=VALUE``, after the scale


def config_error(where: str, key: str, message: str) -> ExperimentConfigError:
    """``<file>: <key>: <message>``."""
    return ExperimentConfigError(f"{where}: {key}: {message}")


def config_key(cfg: Any) -> str:
    """sha256 of a study config's settings that change results (``to_dict`` without name and
    description)."""
    d = cfg.to_dict()
    for k in ("name", "description"):
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


class StudyConfig:
    """What the studies' resolved settings (frozen dataclasses) share: the kebab-case form
    written to the manifest, the seeds and the key."""

    name: str
    study: str
    scale: str
    seeds: int

    def to_dict(self) -> dict[str, Any]:
        """Kebab-case, JSON-ready settings (no cap written as ``"none"``)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if f.name == "caps_w":
                v = ["none" if c is None else c for c in v]
            elif f.name == "accuracy":  # (dataset, target) pairs
                v = dict(v)
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name.replace("_", "-")] = v
        return out

    def key(self) -> str:
        return config_key(self)

    def unused_keys(self, given: Collection[str]) -> list[str]:
        """The keys of ``given`` (those the file and ``--set`` give) that nothing this
        study runs reads, each with why (a scenario the file leaves out): an experiment
        file is shared across scenarios, so they are named in a warning, not refused."""
        return []

    def seed_list(self) -> list[int]:
        return list(range(self.seeds))


class Fields:
    """Typed reads of a merged experiment table; every error names the file and the key."""

    def __init__(self, m: Mapping[str, Any], where: str, defaults: Mapping[str, Any]) -> None:
        self.m, self.where = m, where
        for key, default in defaults.items():
            if default is None and m.get(key) is None:
                raise config_error(where, key, "required key missing")

    def err(self, key: str, message: str) -> ExperimentConfigError:
        return config_error(self.where, key, message)

    def text(self, key: str, allowed: tuple[str, ...] | None = None) -> str:
        v = self.m[key]
        if not isinstance(v, str):
            raise self.err(key, f"must be a string, got {v!r}")
        if allowed is not None and v not in allowed:
            raise self.err(key, f"unknown value {v!r}; allowed: {', '.join(allowed)}")
        return v

    def str_list(
        self, key: str, allowed: tuple[str, ...], *, empty_ok: bool = False, min_len: int = 1
    ) -> tuple[str, ...]:
        v = self.m[key]
        if not isinstance(v, list) or (len(v) < min_len and not empty_ok):
            what = "a non-empty list (empty sweep)" if min_len == 1 else f"≥ {min_len} values"
            raise self.err(key, f"must be {what}; got {v!r}")
        for x in v:
            if x not in allowed:
                raise self.err(key, f"unknown value {x!r}; allowed: {', '.join(allowed)}")
        if len(set(v)) != len(v):
            raise self.err(key, f"duplicate values in {v!r}")
        return tuple(v)

    def integer(self, key: str, lo: int) -> int:
        v = self.m[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise self.err(key, f"must be an integer ≥ {lo}, got {v!r}")
        return v

    def number(self, key: str, lo: float, hi: float = math.inf, open_lo: bool = True) -> float:
        v = self.m[key]
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.err(key, f"must be a number, got {v!r}")
        x = float(v)
        ok = (x > lo if open_lo else x >= lo) and x < hi and not math.isnan(x)
        if not ok:
            lo_s = f"> {lo:g}" if open_lo else f"≥ {lo:g}"
            hi_s = "" if math.isinf(hi) else f" and < {hi:g}"
            raise self.err(key, f"must be {lo_s}{hi_s}, got {v!r}")
        return x

    def caps(self, key: str = "caps-w") -> tuple[float | None, ...]:
        """A non-empty list of caps in W (``"none"``: no cap), without duplicates."""
        raw = self.m[key]
        if not isinstance(raw, list) or not raw:
            raise self.err(key, f"must be a non-empty list (empty sweep); got {raw!r}")
        caps: list[float | None] = []
        for c in raw:
            try:
                caps.append(PowerLimit(c).cap_w)
            except ValueError:
                raise self.err(
                    key, f"{c!r} is not a cap; allowed: numbers of watts > 0 or 'none'"
                ) from None
        if len(set(caps)) != len(caps):
            raise self.err(key, f"duplicate caps in {raw!r}")
        return tuple(caps)

    def batch_sizes(self, key: str = "batch-sizes") -> tuple[int, ...]:
        try:
            return tuple(validate_batch_sizes(self.m[key]))
        except ValueError as exc:
            raise ExperimentConfigError(f"{self.where}: {exc}") from None


def unknown_keys_error(
    unknown: list[str],
    allowed: Mapping[str, Any] | tuple[str, ...],
    where: str,
    what: str = "key(s)",
) -> ExperimentConfigError:
    """``<where> unknown key(s) modles (did you mean models?)``: each unknown key with the
    nearest known one, else the known keys (``key_hint``: the run settings' rule)."""
    hints = [key_hint(key, allowed) for key in unknown]
    close = [h for h in hints if h.startswith(" (did you mean")]
    if len(close) == len(hints):  # every key has a near one: name each with it
        named = ", ".join(f"{key}{hint}" for key, hint in zip(unknown, hints, strict=True))
        return ExperimentConfigError(f"{where} unknown {what} {named}")
    named = ", ".join(
        f"{key}{hint}" if hint in close else key for key, hint in zip(unknown, hints, strict=True)
    )
    return ExperimentConfigError(
        f"{where} unknown {what} {named}; known: {', '.join(sorted(allowed))}"
    )


def check_keys(
    table: Mapping[str, Any], where: str, section: str, allowed: Mapping[str, Any]
) -> None:
    """Unknown keys in ``[section]`` are an error naming the nearest known key."""
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise unknown_keys_error(unknown, allowed, f"{where}: [{section}]")


def _scale_table(data: Mapping[str, Any], where: str, scale: str) -> Mapping[str, Any]:
    """The ``[scale.<scale>]`` table (empty when absent); unknown scales are errors."""
    if scale not in SCALES:
        raise ExperimentConfigError(
            f"--scale: unknown scale {scale!r}; allowed: {', '.join(SCALES)}"
        )
    scales = data.get("scale", {})
    if not isinstance(scales, Mapping):
        raise ExperimentConfigError(f"{where}: scale: must be tables [scale.mini]/[scale.paper]")
    bad_scales = sorted(set(scales) - set(SCALES))
    if bad_scales:
        raise unknown_keys_error(bad_scales, SCALES, f"{where}: [scale.{bad_scales[0]}]", "scale")
    return dict(scales.get(scale, {}))


def merge_scale(
    data: Mapping[str, Any],
    where: str,
    defaults: Mapping[str, Any],
    options: FileOptions,
) -> dict[str, Any]:
    """``defaults``, then ``[experiment]``, then ``[scale.<scale>]``, then ``--set``s, then
    ``--seeds``.

    Any study's file has these two tables only; keys outside ``defaults``, unknown scales
    and a missing ``[experiment]`` are errors naming the table.
    """
    override = _scale_table(data, where, options.scale)
    top_unknown = sorted(set(data) - {"experiment", "scale"})
    if top_unknown:
        raise unknown_keys_error(
            top_unknown, ("experiment", "scale"), f"{where}:", "top-level table(s)"
        )
    base = data.get("experiment")
    if not isinstance(base, Mapping):
        raise ExperimentConfigError(f"{where}: missing the [experiment] table")
    check_keys(base, where, "experiment", defaults)
    check_keys(override, where, f"scale.{options.scale}", defaults)
    merged: dict[str, Any] = {**defaults, **base, **override}
    file_dir = Path(where).absolute().parent
    for key in FLEET_KEYS:
        value = {**base, **override}.get(key)
        if isinstance(value, str) and value.strip():
            merged[key] = str(fleet_path(value.strip(), file_dir))
    for key in FLEET_LIST_KEYS:
        if key in defaults:  # a study without the key (the fine-tuning one) never has it
            value = {**base, **override}.get(key, merged.get(key))
            merged[key] = _fleet_list_paths(value, file_dir)
    if options.sets:
        unknown = sorted(set(options.sets) - set(defaults))
        if unknown:
            raise unknown_keys_error(unknown, defaults, "--set:")
        merged.update(options.sets)
        for key in FLEET_LIST_KEYS:
            if key in options.sets:
                merged[key] = _fleet_list_paths(options.sets[key], None)
        for key in PATH_KEYS:
            value = options.sets.get(key)
            if isinstance(value, str) and value.strip() and key in FLEET_KEYS:
                merged[key] = str(fleet_path(value.strip()))
            elif isinstance(value, str) and value.strip():
                merged[key] = str(Path(value).expanduser().absolute())
    if options.seeds is not None:
        merged["seeds"] = options.seeds
    if merged.get("name") is not None:  # the output folder's name: NAME-SCALE
        try:
            check_safe_name(merged["name"], "name")
        except UnsafeNameError as err:
            raise ExperimentConfigError(f"{where}: {err}") from None
    return merged


def given_keys(data: Mapping[str, Any], options: FileOptions) -> set[str]:
    """The keys an experiment file sets in ``[experiment]`` and ``[scale.<scale>]``, and
    those of ``--set`` (the defaults of keys it leaves out are not given)."""
    base = data.get("experiment")
    scale = data.get("scale", {})
    override = scale.get(options.scale, {}) if isinstance(scale, Mapping) else {}
    return {
        *(base if isinstance(base, Mapping) else {}),
        *(override if isinstance(override, Mapping) else {}),
        *(options.sets or {}),
    }


def _fleet_list_paths(value: Any, base: Path | None) -> Any:
    """A list of fleets with each name or relative path resolved (``fleet_path``: against
    ``base``, the file's folder, or the current directory); anything else as it is, for
    the study's check to refuse."""
    if not isinstance(value, list):
        return value
    return [
        str(fleet_path(v.strip(), base)) if isinstance(v, str) and v.strip() else v for v in value
    ]


def read_experiment_file(path: str | Path) -> tuple[dict[str, Any], str]:
    """The parsed TOML of an experiment file and its name for messages; a missing file or
    bad TOML is an ``ExperimentConfigError`` naming the file."""
    p = Path(path)
    shipped = shipped_file("experiments", str(path))
    if not p.exists() and shipped is not None:
        p = shipped
    where = str(p)
    if not p.is_file():
        what = "is a folder, not an experiment file" if p.is_dir() else "experiment file not found"
        names = ", ".join(shipped_names("experiments"))
        raise ExperimentConfigError(
            f"{where}: {what}; give an experiment TOML file or a shipped experiment's name "
            f"({names})"
        )
    try:
        return tomllib.loads(p.read_text(encoding="utf-8")), where
    except tomllib.TOMLDecodeError as exc:
        raise ExperimentConfigError(f"{where}: not valid TOML ({exc})") from None
