"""The settings of the robustness study (``study = "federated-robustness"``): its fleets
(shipped and generated), arms, run settings and the two target criteria.

The criteria are the run's own (``fl_server.target``): the first round at
``target-accuracy``, and the first round whose mean accuracy over ``target-window``
rounds reaches it. Every cell runs with the study's ``target-accuracy`` and
``target-window`` and stops at the second, by which the first is decided too (a window
whose mean reaches the target holds a round that does)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fl_client.settings import RunSettings, SettingsError
from simulations.experiments.config import (
    STUDY_METHODS,
    Fields,
    FileOptions,
    StudyConfig,
    config_error,
    given_keys,
    merge_scale,
)
from simulations.experiments.training_settings import TRAINING_DEFAULTS, TrainingSettings

NAME = "federated-robustness"
#: How the cells run: ``in-process`` (many cells, one after another, in one long-lived
#: worker process with Flower's in-process engine: the interpreter, PyTorch and the app
#: are loaded once), ``in-process-warm`` (the same, and Ray and its actors are kept from
#: one cell to the next: ``cell_worker.keep_engine_warm``) or ``runtime`` (each cell in a
#: process of its own through Flower's Simulation Runtime, as the federated study runs them).
ENGINES = ("in-process-warm", "in-process", "runtime")
#: Run settings an arm may not set: the study sets them per cell.
STUDY_SET_KEYS = (
    "seed",
    "fleet",
    "cache-dir",
    "output-dir",
    "run-dir",
    "target-accuracy",
    "target-window",
)
#: Keys of earlier versions of the study, refused with what to write instead. Their
#: records stay readable: the report takes an old folder's ``smoothing-rounds`` as its
#: window and applies both criteria to the per-round accuracies, as before.
RETIRED_KEYS = {
    "smoothing-rounds": "renamed target-window (the runs' own setting, which they now stop by)",
    "run-past-target": (
        "retired: the runs stop once both criteria are decided (the first round whose mean "
        "over target-window rounds reaches target-accuracy); target-window = 1 stops at the "
        "first round at the target"
    ),
}
ARM_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
#: The study's arms unless the file lists its own: B1, and power-aware with each balance
#: mode (``steps`` with FedNova's and with FedAvg's aggregation); ``off`` is the
#: synchronous power-aware method (``aggregation = "auto"`` would make it ``fedbuff``).
DEFAULT_ARMS: list[dict[str, Any]] = [
    {"name": "b1", "method": "b1"},
    {"name": "off", "method": "power-aware", "aggregation": "fedavg"},
    {"name": "samples", "method": "power-aware", "balance": "samples"},
    {
        "name": "steps-fednova",
        "method": "power-aware",
        "balance": "steps",
        "aggregation": "fednova",
    },
    {"name": "steps-fedavg", "method": "power-aware", "balance": "steps", "aggregation": "fedavg"},
    {"name": "energy", "method": "power-aware", "balance": "energy"},
]

#: Allowed keys and their defaults (None: required).
DEFAULTS: dict[str, Any] = {
    "name": None,
    "study": None,
    "description": "",
    # shipped fleets (names or files) and generated ones (``fleet_gen`` seeds), in run order
    "fleets": ["default"],
    "generated-fleets": [],
    "seeds": 5,
    "arms": DEFAULT_ARMS,
    # the arms every other arm's paired ratios are taken against
    "ratio-against": ["b1", "off"],
    # the run settings every cell shares, with the run's defaults (``TrainingSettings``);
    # target-window: the smoothed criterion, the first round whose mean accuracy over this
    # many rounds (it and the ones before) reaches the target, at which each run stops
    **TRAINING_DEFAULTS,
    "engine": "in-process-warm",
    "cell-timeout-s": 1800,
}


@dataclass(frozen=True)
class Arm:
    """One arm: a method and its run-setting overrides."""

    name: str
    method: str
    settings: tuple[tuple[str, Any], ...]

    def overrides(self) -> dict[str, Any]:
        return {"method": self.method, **dict(self.settings)}

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **self.overrides()}


@dataclass(frozen=True)
class RobustnessConfig(TrainingSettings, StudyConfig):
    """The resolved settings of one robustness study at one scale: the run settings every
    cell shares (``TrainingSettings``) and the study's own."""

    name: str
    study: str
    description: str
    scale: str
    fleets: tuple[str, ...]
    generated_fleets: tuple[int, ...]
    seeds: int
    arms: tuple[Arm, ...]
    ratio_against: tuple[str, ...]
    engine: str
    cell_timeout_s: int

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["arms"] = [a.to_dict() for a in self.arms]
        return out

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def base_overrides(self) -> dict[str, Any]:
        """The run settings every cell shares (before its fleet, seed and arm)."""
        return {**self.training_overrides(), "drift-check-every": 0}


def parse_robustness(data: Mapping[str, Any], where: str, options: FileOptions) -> RobustnessConfig:
    """Validate a parsed robustness experiment; every error names the key. The fleets'
    files and data splits are checked by the study's plan (``robustness.check_fleets``),
    which needs the generated fleets written."""
    retired = sorted(given_keys(data, options) & set(RETIRED_KEYS))
    if retired:
        raise config_error(where, retired[0], RETIRED_KEYS[retired[0]])
    m = merge_scale(data, where, DEFAULTS, options)
    f = Fields(m, where, DEFAULTS)
    arms = _arms(f, "arms")
    names = tuple(a.name for a in arms)
    cfg = RobustnessConfig(
        **TrainingSettings.parse_values(m, where),
        name=f.text("name"),
        study=f.text("study", (NAME,)),
        description=f.text("description"),
        scale=options.scale,
        fleets=_fleet_names(f, "fleets"),
        generated_fleets=_seed_list(f, "generated-fleets"),
        seeds=f.integer("seeds", 1),
        arms=arms,
        ratio_against=f.str_list("ratio-against", names),
        engine=f.text("engine", ENGINES),
        cell_timeout_s=f.integer("cell-timeout-s", 1),
    )
    if not cfg.fleets and not cfg.generated_fleets:
        raise config_error(
            where, "fleets", "no fleet to run: fleets and generated-fleets are empty"
        )
    for arm in cfg.arms:  # each arm's settings are run settings, with the study's base
        try:
            RunSettings.from_config({**cfg.base_overrides(), **arm.overrides()})
        except SettingsError as exc:
            raise config_error(where, "arms", f"arm {arm.name}: {exc}") from None
    return cfg


def _arms(f: Fields, key: str) -> tuple[Arm, ...]:
    """A non-empty list of tables ``{name, method, <run setting> = value, …}``."""
    raw = f.m[key]
    if not isinstance(raw, list) or not raw:
        raise f.err(key, f"must be a non-empty list of tables {{name, method, …}}; got {raw!r}")
    arms: list[Arm] = []
    for i, t in enumerate(raw):
        where = f"arm #{i + 1}"
        if not isinstance(t, Mapping):
            raise f.err(key, f"{where}: must be a table {{name, method, …}}; got {t!r}")
        name, method = t.get("name"), t.get("method")
        if not isinstance(name, str) or not ARM_NAME.match(name):
            raise f.err(
                key, f"{where}: name must be lowercase letters, digits and dashes; got {name!r}"
            )
        if method not in STUDY_METHODS:
            allowed = ", ".join(STUDY_METHODS)
            raise f.err(key, f"arm {name}: method: unknown value {method!r}; allowed: {allowed}")
        settings = {k: v for k, v in t.items() if k not in ("name", "method")}
        for k, v in settings.items():
            if k in STUDY_SET_KEYS:
                raise f.err(key, f"arm {name}: {k}: set by the study, not by an arm")
            if isinstance(v, Mapping | list) or v is None:
                raise f.err(key, f"arm {name}: {k}: must be a string, number or boolean; got {v!r}")
        arms.append(Arm(name, str(method), tuple(sorted(settings.items()))))
    names = [a.name for a in arms]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise f.err(key, f"two arms named {', '.join(dupes)}")
    return tuple(arms)


def _fleet_names(f: Fields, key: str) -> tuple[str, ...]:
    """A list (maybe empty) of distinct fleet names or files."""
    v = f.m[key]
    if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
        raise f.err(key, f"must be a list of fleet names or files; got {v!r}")
    if len(set(v)) != len(v):
        raise f.err(key, f"duplicate fleets in {v!r}")
    return tuple(v)


def _seed_list(f: Fields, key: str) -> tuple[int, ...]:
    """A list (maybe empty) of distinct generator seeds (integers ≥ 0)."""
    v = f.m[key]
    if not isinstance(v, list) or any(
        isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v
    ):
        raise f.err(key, f"must be a list of integers ≥ 0 (fleet generator seeds); got {v!r}")
    if len(set(v)) != len(v):
        raise f.err(key, f"duplicate seeds in {v!r}")
    return tuple(v)
