"""Experiment files (TOML): parsing, validation and the ``mini`` / ``paper`` scales.

An experiment file has one ``[experiment]`` table with the study's settings and optional
``[scale.mini]`` / ``[scale.paper]`` tables that override any of them for that scale.
Every key is kebab-case; an unknown key, a bad value or an empty sweep is an error that
names the key and what is allowed, raised before any training starts.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fl_client import selector, task
from fl_client.settings import tomllib

STUDIES = ("single-device",)
#: Every study an experiment file may name; ``load_any`` dispatches on it.
ALL_STUDIES = ("single-device", "federated", "proxy-sensitivity")
SCALES = ("mini", "paper")
#: Methods of the single-device study, in report order.
STUDY_METHODS = ("b1", "b2", "power-aware", "oracle")
METHOD_LABELS = {
    "b1": "Baseline 1",
    "b2": "Baseline 2",
    "power-aware": "Ours",
    "oracle": "Oracle (fastest config.)",
}
TARGETS = ("digits",)
PROXIES = ("digits-rotated", "digits")
UNCAPPED_GRIDS = ("highest", "full")


class ExperimentConfigError(ValueError):
    """An experiment file that cannot be run; the message names the file and the key."""


@dataclass(frozen=True)
class SingleDeviceConfig:
    """The resolved settings of one single-device study at one scale (all from the TOML).

    Attributes mirror the kebab-case keys (``caps-w`` → ``caps_w``); a cap of None is
    "no cap".
    """

    name: str
    study: str
    description: str
    scale: str
    devices: tuple[str, ...]
    caps_w: tuple[float | None, ...]
    models: tuple[str, ...]
    methods: tuple[str, ...]
    target: str
    proxy: str
    seeds: int
    batch_sizes: tuple[int, ...]
    lr_ref: float
    b_ref: int
    target_accuracy: float
    proxy_target_accuracy: float
    eval_every_samples: int
    max_samples: int
    target_test_fraction: float
    target_train_size: int
    proxy_train_size: int
    proxy_eval_size: int
    proxy_rotate_deg: float
    proxy_noise_std: float
    profile_warmup_steps: int
    profile_steps: int
    profile_uncapped: str
    ts_samples: int
    torch_threads: int
    torch_device: str = "cpu"

    def to_dict(self) -> dict[str, Any]:
        """Kebab-case, JSON-ready settings (no cap written as ``"none"``)."""
        out: dict[str, Any] = {}
        for k, v in asdict(self).items():
            if k == "caps_w":
                v = ["none" if c is None else c for c in v]
            elif isinstance(v, tuple):
                v = list(v)
            out[k.replace("_", "-")] = v
        return out

    def key(self) -> str:
        return config_key(self)

    def seed_list(self) -> list[int]:
        return list(range(self.seeds))


def config_key(cfg: Any) -> str:
    """sha256 of a study config's settings that change results (``to_dict`` without name and
    description)."""
    d = cfg.to_dict()
    for k in ("name", "description"):
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


#: Allowed keys and their defaults (None: required). Values are validated in ``_build``.
_DEFAULTS: dict[str, Any] = {
    "name": None,
    "study": None,
    "description": "",
    "devices": None,
    "caps-w": None,
    "models": ["cnn"],
    "methods": list(STUDY_METHODS),
    "target": "digits",
    "proxy": "digits-rotated",
    "seeds": 3,
    "batch-sizes": [4, 8, 16, 32, 64, 128],
    "lr-ref": 5e-4,
    "b-ref": 128,
    "target-accuracy": 0.9,
    "proxy-target-accuracy": 0.9,
    "eval-every-samples": 512,
    "max-samples": 40_000,
    "target-test-fraction": 0.2,
    "target-train-size": 0,  # 0: the whole train split
    "proxy-train-size": 0,  # 0: the whole proxy-train slice
    "proxy-eval-size": 0,
    "proxy-rotate-deg": 25.0,
    "proxy-noise-std": 0.3,
    "profile-warmup-steps": 1,
    "profile-steps": 3,
    "profile-uncapped": "highest",
    "ts-samples": 4096,
    "torch-threads": 1,
    "torch-device": "cpu",  # where the r-estimation training runs: cpu | cuda | auto
}


#: Where a study's training runs may execute ("auto": CUDA when available, else the CPU).
TORCH_DEVICES = ("cpu", "cuda", "auto")


def _err(where: str, key: str, message: str) -> ExperimentConfigError:
    return ExperimentConfigError(f"{where}: {key}: {message}")


class Fields:
    """Typed reads of a merged experiment table; every error names the file and the key."""

    def __init__(self, m: Mapping[str, Any], where: str, defaults: Mapping[str, Any]) -> None:
        self.m, self.where = m, where
        for key, default in defaults.items():
            if default is None and m.get(key) is None:
                raise _err(where, key, "required key missing")

    def err(self, key: str, message: str) -> ExperimentConfigError:
        return _err(self.where, key, message)

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
                caps.append(selector.validate_p_max_w(c))
            except ValueError:
                raise self.err(
                    key, f"{c!r} is not a cap; allowed: numbers of watts > 0 or 'none'"
                ) from None
        if len(set(caps)) != len(caps):
            raise self.err(key, f"duplicate caps in {raw!r}")
        return tuple(caps)

    def batch_sizes(self, key: str = "batch-sizes") -> tuple[int, ...]:
        try:
            return tuple(selector.validate_batch_sizes(self.m[key]))
        except ValueError as exc:
            raise ExperimentConfigError(f"{self.where}: {exc}") from None


def check_keys(
    table: Mapping[str, Any], where: str, section: str, allowed: Mapping[str, Any]
) -> None:
    """Unknown keys in ``[section]`` are an error listing the ``allowed`` ones."""
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ExperimentConfigError(
            f"{where}: [{section}] unknown key(s) {', '.join(unknown)}; allowed: "
            f"{', '.join(allowed)}"
        )


def merge_scale(
    data: Mapping[str, Any],
    where: str,
    defaults: Mapping[str, Any],
    *,
    scale: str,
    seeds: int | None,
    sets: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``defaults``, then ``[experiment]``, then ``[scale.<scale>]``, then ``--set``s, then
    ``--seeds``.

    Any study's file has these two tables only; keys outside ``defaults``, unknown scales
    and a missing ``[experiment]`` are errors naming the table.
    """
    if scale not in SCALES:
        raise ExperimentConfigError(
            f"--scale: unknown scale {scale!r}; allowed: {', '.join(SCALES)}"
        )
    top_unknown = sorted(set(data) - {"experiment", "scale"})
    if top_unknown:
        raise ExperimentConfigError(
            f"{where}: unknown top-level table(s) {', '.join(top_unknown)}; allowed: "
            "experiment, scale"
        )
    base = data.get("experiment")
    if not isinstance(base, Mapping):
        raise ExperimentConfigError(f"{where}: missing the [experiment] table")
    check_keys(base, where, "experiment", defaults)
    scales = data.get("scale", {})
    if not isinstance(scales, Mapping):
        raise ExperimentConfigError(f"{where}: scale: must be tables [scale.mini]/[scale.paper]")
    bad_scales = sorted(set(scales) - set(SCALES))
    if bad_scales:
        raise ExperimentConfigError(
            f"{where}: [scale.{bad_scales[0]}] unknown scale; allowed: {', '.join(SCALES)}"
        )
    override = scales.get(scale, {})
    check_keys(override, where, f"scale.{scale}", defaults)
    merged: dict[str, Any] = dict(defaults)
    merged.update(base)
    merged.update(override)
    if sets:
        unknown = sorted(set(sets) - set(defaults))
        if unknown:
            raise ExperimentConfigError(
                f"--set: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(defaults)}"
            )
        merged.update(sets)
    if seeds is not None:
        merged["seeds"] = seeds
    return merged


def read_experiment_file(path: str | Path) -> tuple[dict[str, Any], str]:
    """The parsed TOML of an experiment file and its name for messages; a missing file or
    bad TOML is an ``ExperimentConfigError`` naming the file."""
    p = Path(path)
    where = str(p)
    if not p.is_file():
        raise ExperimentConfigError(f"{where}: experiment file not found")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8")), where
    except tomllib.TOMLDecodeError as exc:
        raise ExperimentConfigError(f"{where}: not valid TOML ({exc})") from None


def load_experiment(
    path: str | Path,
    *,
    scale: str = "mini",
    seeds: int | None = None,
    sets: Mapping[str, Any] | None = None,
) -> SingleDeviceConfig:
    """Read and validate the experiment file ``path`` at ``scale``.

    Parameters
    ----------
    path : path
        The TOML file.
    scale : {"mini", "paper"}
        Which ``[scale.*]`` overrides apply.
    seeds : int, optional
        Overrides ``seeds`` (the command's ``--seeds``).
    sets : mapping, optional
        Keys that override the file after the scale (the command's ``--set KEY=VALUE``).

    Raises
    ------
    ExperimentConfigError
        Missing file, TOML syntax, unknown keys or bad values (naming the key).
    """
    data, where = read_experiment_file(path)
    return parse_experiment(data, where, scale=scale, seeds=seeds, sets=sets)


def load_any(
    path: str | Path,
    *,
    scale: str = "mini",
    seeds: int | None = None,
    sets: Mapping[str, Any] | None = None,
) -> Any:
    """Read and validate an experiment file of any study (``study`` in ``[experiment]``):
    a ``SingleDeviceConfig`` or a ``simulations.experiments.federated.FederatedConfig``."""
    data, where = read_experiment_file(path)
    base = data.get("experiment")
    study = base.get("study") if isinstance(base, Mapping) else None
    if study == "federated":
        from simulations.experiments.federated import parse_federated

        return parse_federated(data, where, scale=scale, seeds=seeds, sets=sets)
    if study == "proxy-sensitivity":
        from simulations.experiments.proxy_sensitivity import parse_sensitivity

        return parse_sensitivity(data, where, scale=scale, seeds=seeds, sets=sets)
    if isinstance(base, Mapping) and study is not None and study not in ALL_STUDIES:
        raise _err(where, "study", f"unknown value {study!r}; allowed: {', '.join(ALL_STUDIES)}")
    return parse_experiment(data, where, scale=scale, seeds=seeds, sets=sets)


def parse_experiment(
    data: Mapping[str, Any],
    where: str,
    *,
    scale: str = "mini",
    seeds: int | None = None,
    sets: Mapping[str, Any] | None = None,
) -> SingleDeviceConfig:
    """Validate an already-parsed experiment mapping (see ``load_experiment``)."""
    merged = merge_scale(data, where, _DEFAULTS, scale=scale, seeds=seeds, sets=sets)
    return _build(merged, where, scale)


def _build(m: Mapping[str, Any], where: str, scale: str) -> SingleDeviceConfig:
    from fl_client.devices.simulated import available_device_kinds

    f = Fields(m, where, _DEFAULTS)
    text, str_list, integer, number = f.text, f.str_list, f.integer, f.number
    devices = str_list("devices", tuple(available_device_kinds()))
    caps = f.caps()
    batch_sizes = f.batch_sizes()
    b_ref = integer("b-ref", 1)
    cfg = SingleDeviceConfig(
        name=text("name"),
        study=text("study", STUDIES),
        description=text("description"),
        scale=scale,
        devices=devices,
        caps_w=tuple(caps),
        models=str_list("models", task.MODEL_NAMES),
        methods=str_list("methods", STUDY_METHODS),
        target=text("target", TARGETS),
        proxy=text("proxy", PROXIES),
        seeds=integer("seeds", 1),
        batch_sizes=tuple(batch_sizes),
        lr_ref=number("lr-ref", 0.0),
        b_ref=b_ref,
        target_accuracy=number("target-accuracy", 0.0, 1.0),
        proxy_target_accuracy=number("proxy-target-accuracy", 0.0, 1.0),
        eval_every_samples=integer("eval-every-samples", 1),
        max_samples=integer("max-samples", 1),
        target_test_fraction=number("target-test-fraction", 0.0, 1.0),
        target_train_size=integer("target-train-size", 0),
        proxy_train_size=integer("proxy-train-size", 0),
        proxy_eval_size=integer("proxy-eval-size", 0),
        proxy_rotate_deg=number("proxy-rotate-deg", -180.0, 180.0, open_lo=False),
        proxy_noise_std=number("proxy-noise-std", 0.0, open_lo=False),
        profile_warmup_steps=integer("profile-warmup-steps", 0),
        profile_steps=integer("profile-steps", 1),
        profile_uncapped=text("profile-uncapped", UNCAPPED_GRIDS),
        ts_samples=integer("ts-samples", 1),
        torch_threads=integer("torch-threads", 1),
        torch_device=text("torch-device", TORCH_DEVICES),
    )
    # Methods that need each other's inputs: all need the target runs; ours/b2 the proxy r.
    return cfg
