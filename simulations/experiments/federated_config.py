"""The settings of the federated study (``study = "federated"``): keys, defaults, scenarios
and validation, fleet files included."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_client.settings import (
    RunSettings,
    SettingsError,
    fleet_path,
    load_fleet,
)
from fl_client.settings_table import BALANCE_MODES, RUN, check_run_keys, choices
from simulations.experiments.config import (
    STUDY_METHODS,
    Fields,
    FileOptions,
    StudyConfig,
    config_error,
    merge_scale,
)

NAME = "federated"
SCENARIOS = ("balance-energy", "varying-cap", "drift", "balance")
#: Variants of each scenario, in report order (the first is the reference).
SCENARIO_VARIANTS = {
    "balance-energy": ("off", "energy"),
    "varying-cap": ("fixed-at-minimum", "schedule"),
    "drift": ("off", "check"),
}
#: The balance study's arms on each of its fleets (``balance``): B1, then power-aware with
#: each ``balance`` mode (``off`` is the per-device rule, the reference of the paired ratios).
BALANCE_ARMS = ("b1", *BALANCE_MODES)
#: ``critical-r-arms``: extra arms ``MODE@W`` of the balance study, ``balance = MODE`` with
#: ``critical-r-weight = W`` (how much r_b weighs in the pace-setter's choice), W in (0, 1].
WEIGHTED_MODES = tuple(m for m in BALANCE_MODES if m != "off")
#: The keys only one scenario reads: set in a file whose ``scenarios`` leave that scenario
#: out, they are named in a warning at start (``FederatedConfig.unused_keys``).
SCENARIO_KEYS = {
    "balance-energy": ("deadline-margin",),
    "varying-cap": ("varying-cap-fleet",),
    "drift": ("drift-fleet", "drift-check-every", "drift-threshold"),
    "balance": ("balance-fleets", "balance-modes", "critical-r-arms"),
}
#: Version of the cell records (part of their key). 2: the runs' records are version 2
#: (kebab-case rounds.jsonl, per-node totals read from the run's summary), so cells of
#: version 1 are run again rather than mixed with them. 3: records version 3 (idle waiting
#: as ``*-idle-energy-j``, training + profiling as ``*-busy-energy-j``, energy by node role).
CELL_VERSION = 3

#: The study's keys that are run settings with the run's default (``[tool.flwr.app.config]``,
#: declared in ``fl_client.settings_table``): a cell runs with the study's value of each.
RUN_KEYS = (
    "fleet",
    "model",
    "partitioning",
    "dirichlet-alpha",
    "num-rounds",
    "target-accuracy",
    "local-epochs",
    "lr-ref",
    "b-ref",
    "proxy-target-accuracy",
    "r-max-samples",
    "r-eval-every-samples",
    "profile-grid",
    "drift-threshold",
)
#: Allowed keys and their defaults (None: required).
DEFAULTS: dict[str, Any] = {
    "name": None,
    "study": None,
    "description": "",
    "methods": list(STUDY_METHODS),
    "seeds": 3,
    **{key: RUN[key].default for key in RUN_KEYS},
    "batch-sizes": RUN["batch-sizes"].value,  # a list in experiment files
    "scenarios": ["balance-energy", "varying-cap", "drift"],  # balance: only when asked for
    "scenario-method": "power-aware",
    # the balance-energy scenario's deadline margin (its "energy" variant)
    "deadline-margin": RUN["deadline-margin"].default,
    "varying-cap-fleet": "varying-cap",
    "drift-fleet": "drift",
    "drift-check-every": 2,  # the drift scenario's "check" variant (the run's default: never)
    "cell-timeout-s": 1800,
    # the balance scenario (issue 22): fleets (in run order) and power-aware's balance modes
    "balance-fleets": ["default"],
    "balance-modes": list(BALANCE_MODES),
    "critical-r-arms": [],
}


@dataclass(frozen=True)
class FederatedConfig(StudyConfig):
    """The resolved settings of one federated study at one scale (all from the TOML)."""

    name: str
    study: str
    description: str
    scale: str
    fleet: str
    methods: tuple[str, ...]
    seeds: int
    model: str
    partitioning: str
    dirichlet_alpha: float
    num_rounds: int
    target_accuracy: float
    local_epochs: int
    batch_sizes: tuple[int, ...]
    lr_ref: float
    b_ref: int
    proxy_target_accuracy: float
    r_max_samples: int
    r_eval_every_samples: int
    profile_grid: str
    scenarios: tuple[str, ...]
    scenario_method: str
    deadline_margin: float
    varying_cap_fleet: str
    drift_fleet: str
    drift_check_every: int
    drift_threshold: float
    cell_timeout_s: int
    balance_fleets: tuple[str, ...]
    balance_modes: tuple[str, ...]
    critical_r_arms: tuple[tuple[str, float], ...]

    def unused_keys(self, given: Collection[str]) -> list[str]:
        out = [
            f"{key} (scenario {scenario} is not in scenarios)"
            for scenario, keys in SCENARIO_KEYS.items()
            if scenario not in self.scenarios
            for key in keys
            if key in given
        ]
        if "scenario-method" in given and not set(self.scenarios) - {"balance"}:
            out.append("scenario-method (no scenario of scenarios reads it)")
        return out

    def base_overrides(self) -> dict[str, Any]:
        """The run settings every cell shares (before its own fleet/method/scenario), each a
        key of the settings table (or a deprecated name it still runs)."""
        overrides = {
            "model": self.model,
            "partitioning": self.partitioning,
            "dirichlet-alpha": self.dirichlet_alpha,
            "num-rounds": self.num_rounds,
            "target-accuracy": self.target_accuracy,
            "local-epochs": self.local_epochs,
            "batch-sizes": ",".join(str(b) for b in self.batch_sizes),
            "lr-ref": self.lr_ref,
            "b-ref": self.b_ref,
            "proxy-target-accuracy": self.proxy_target_accuracy,
            "r-max-samples": self.r_max_samples,
            "r-eval-every-samples": self.r_eval_every_samples,
            "profile-grid": self.profile_grid,
            "drift-check-every": 0,
        }
        check_run_keys(overrides, f"{NAME} study: run settings")
        return overrides


def parse_federated(data: Mapping[str, Any], where: str, options: FileOptions) -> FederatedConfig:
    """Validate a parsed federated experiment: unknown keys, bad values, empty sweeps, fleet
    files that do not load or do not fit the scenario are errors naming the key, raised
    before any training starts."""
    from fl_client import model_zoo

    m = merge_scale(data, where, DEFAULTS, options)
    f = Fields(m, where, DEFAULTS)
    text, str_list, integer, number = f.text, f.str_list, f.integer, f.number
    cfg = FederatedConfig(
        name=text("name"),
        study=text("study", (NAME,)),
        description=text("description"),
        scale=options.scale,
        fleet=text("fleet"),
        methods=str_list("methods", STUDY_METHODS),
        seeds=integer("seeds", 1),
        model=text("model", tuple(model_zoo.MODEL_NAMES)),
        partitioning=text("partitioning", choices("partitioning")),
        dirichlet_alpha=number("dirichlet-alpha", 0.0),
        num_rounds=integer("num-rounds", 1),
        target_accuracy=number("target-accuracy", 0.0, 1.0),
        local_epochs=integer("local-epochs", 1),
        batch_sizes=f.batch_sizes(),
        lr_ref=number("lr-ref", 0.0),
        b_ref=integer("b-ref", 1),
        proxy_target_accuracy=number("proxy-target-accuracy", 0.0, 1.0),
        r_max_samples=integer("r-max-samples", 1),
        r_eval_every_samples=integer("r-eval-every-samples", 1),
        profile_grid=text("profile-grid", choices("profile-grid")),
        scenarios=str_list("scenarios", SCENARIOS, empty_ok=True),
        scenario_method=text("scenario-method", STUDY_METHODS),
        deadline_margin=number("deadline-margin", 0.0, 1.0, open_lo=False),
        varying_cap_fleet=text("varying-cap-fleet"),
        drift_fleet=text("drift-fleet"),
        drift_check_every=integer("drift-check-every", 1),
        drift_threshold=number("drift-threshold", 0.0),
        cell_timeout_s=integer("cell-timeout-s", 1),
        balance_fleets=_fleet_list(f, "balance-fleets"),
        balance_modes=str_list("balance-modes", tuple(BALANCE_MODES)),
        critical_r_arms=_weighted_arms(f, "critical-r-arms"),
    )
    _check_fleets(cfg, where)
    return cfg


def weighted_arm_name(mode: str, weight: float) -> str:
    """``steps@0.5``: the arm ``balance = steps`` with ``critical-r-weight = 0.5``."""
    return f"{mode}@{weight:g}"


def _weighted_arms(f: Fields, key: str) -> tuple[tuple[str, float], ...]:
    """``critical-r-arms``: a list of ``MODE@W`` (MODE a ``balance`` mode other than off, W
    a number in (0, 1]), each a (mode, weight) pair; empty by default."""
    v = f.m[key]
    if not isinstance(v, list):
        raise f.err(key, f'must be a list of "MODE@W" strings; got {v!r}')
    out: list[tuple[str, float]] = []
    for x in v:
        mode, at, w = str(x).partition("@") if isinstance(x, str) else ("", "", "")
        try:
            weight = float(w)
        except ValueError:
            weight = math.nan
        if not at or mode not in WEIGHTED_MODES or not 0.0 < weight <= 1.0:
            raise f.err(
                key,
                f"each entry must be MODE@W, MODE one of {', '.join(WEIGHTED_MODES)} and W "
                f'a number in (0, 1] (e.g. "steps@0.5"); got {x!r}',
            )
        out.append((mode, weight))
    if len(set(out)) != len(out):
        raise f.err(key, f"duplicate arms in {v!r}")
    return tuple(out)


def _fleet_list(f: Fields, key: str) -> tuple[str, ...]:
    """A non-empty list of distinct fleet names or files (each is loaded by ``_check_fleets``)."""
    v = f.m[key]
    if not isinstance(v, list) or not v:
        raise f.err(key, f"must be a non-empty list of fleet names or files; got {v!r}")
    for x in v:
        if not isinstance(x, str) or not x.strip():
            raise f.err(key, f"each entry must be a fleet name or file (a string); got {x!r}")
    names = [Path(x).name for x in v]  # the report names a fleet by its file's name
    if len(set(names)) != len(names):
        raise f.err(key, f"two fleets of the same file name in {v!r}")
    return tuple(v)


def _fleet_nodes(path: str, where: str, key: str) -> list[Any]:
    try:
        return load_fleet(path)
    except SettingsError as exc:
        raise config_error(where, key, str(exc)) from None


def _drifts(options: Mapping[str, Any]) -> bool:
    try:
        slow = float(options.get("twin-slowdown", 1.0))
        extra = float(options.get("twin-extra-power-w", 0.0))
    except (TypeError, ValueError):
        return False
    return slow > 1.0 or extra > 0.0


def _check_fleets(cfg: FederatedConfig, where: str) -> None:
    """Every fleet file the study needs loads, fits its scenario and its data split."""
    from simulations.run import check_partitions

    for key, path in [
        ("varying-cap-fleet", cfg.varying_cap_fleet),
        ("drift-fleet", cfg.drift_fleet),
        *(("balance-fleets", path) for path in cfg.balance_fleets),
    ]:  # a fleet that does not exist is a bad value, whether a scenario reads it or not
        if not fleet_path(path).is_file():
            _fleet_nodes(path, where, key)  # its error names the file and the shipped fleets
    fleets = {"fleet": cfg.fleet}
    if "varying-cap" in cfg.scenarios:
        fleets["varying-cap-fleet"] = cfg.varying_cap_fleet
    if "drift" in cfg.scenarios:
        fleets["drift-fleet"] = cfg.drift_fleet
    checks = list(fleets.items())
    if "balance" in cfg.scenarios:
        checks += [("balance-fleets", path) for path in cfg.balance_fleets]
    for key, path in checks:
        nodes = _fleet_nodes(path, where, key)
        if key == "varying-cap-fleet" and not any(n.p_max_schedule for n in nodes):
            raise config_error(where, key, f"{path}: no node has a p-max-schedule (nothing varies)")
        if key == "drift-fleet" and not any(_drifts(n.options) for n in nodes):
            raise config_error(
                where,
                key,
                f"{path}: no node has twin-slowdown > 1 or twin-extra-power-w > 0 (no drift)",
            )
        for seed in cfg.seed_list():
            overrides = {**cfg.base_overrides(), "fleet": str(fleet_path(path)), "seed": seed}
            try:
                check_partitions(RunSettings.from_config(overrides), len(nodes))
            except SettingsError as exc:
                raise config_error(where, key, str(exc)) from None
