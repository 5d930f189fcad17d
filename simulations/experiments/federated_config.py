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
from fl_client.settings_table import BALANCE_MODES, RUN, check_run_keys
from simulations.experiments.config import (
    STUDY_METHODS,
    Fields,
    FileOptions,
    StudyConfig,
    config_error,
    merge_scale,
)
from simulations.experiments.training_settings import (
    TRAINING_DEFAULTS,
    TrainingSettings,
    run_value,
)

NAME = "federated"
SCENARIOS = ("balance-energy", "varying-cap", "drift", "balance")
#: Variants of each scenario, in report order (the first is the reference).
SCENARIO_VARIANTS = {
    "balance-energy": ("off", "energy"),
    "varying-cap": ("fixed-at-minimum", "schedule"),
    "drift": ("off", "check"),
}
#: The title of each scenario's section and figure in the report.
SCENARIO_TITLES = {
    "balance-energy": "The round plan's energy mode: balance off vs energy",
    "varying-cap": "Caps that change over time: schedule vs fixed at the schedule's minimum",
    "drift": "LUT drift: drift check vs none",
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
#: 4: records version 4 (``round-to-target`` by the mean over ``target-window`` rounds,
#: which each run stops at; the first round at the target apart).
CELL_VERSION = 4

#: Allowed keys and their defaults (None: required). Those that are run settings
#: (``TRAINING_DEFAULTS``, ``fleet``, ``deadline-margin``, ``drift-threshold``,
#: ``drift-check-every``) are checked by their entries in the settings table (``run_value``).
DEFAULTS: dict[str, Any] = {
    "name": None,
    "study": None,
    "description": "",
    "methods": list(STUDY_METHODS),
    "seeds": 3,
    "fleet": RUN["fleet"].default,
    **TRAINING_DEFAULTS,
    "drift-threshold": RUN["drift-threshold"].default,
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
class FederatedConfig(TrainingSettings, StudyConfig):
    """The resolved settings of one federated study at one scale (all from the TOML): the
    run settings every cell shares (``TrainingSettings``) and the study's own."""

    name: str
    study: str
    description: str
    scale: str
    fleet: str
    methods: tuple[str, ...]
    seeds: int
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
        overrides = {**self.training_overrides(), "drift-check-every": 0}
        check_run_keys(overrides, f"{NAME} study: run settings")
        return overrides


def parse_federated(data: Mapping[str, Any], where: str, options: FileOptions) -> FederatedConfig:
    """Validate a parsed federated experiment: unknown keys, bad values, empty sweeps, fleet
    files that do not load or do not fit the scenario are errors naming the key, raised
    before any training starts."""
    m = merge_scale(data, where, DEFAULTS, options)
    f = Fields(m, where, DEFAULTS)
    text, str_list, integer = f.text, f.str_list, f.integer
    cfg = FederatedConfig(
        **TrainingSettings.parse_values(m, where),
        name=text("name"),
        study=text("study", (NAME,)),
        description=text("description"),
        scale=options.scale,
        fleet=run_value(m, "fleet", where),
        methods=str_list("methods", STUDY_METHODS),
        seeds=integer("seeds", 1),
        scenarios=str_list("scenarios", SCENARIOS, empty_ok=True),
        scenario_method=text("scenario-method", STUDY_METHODS),
        deadline_margin=run_value(m, "deadline-margin", where),
        varying_cap_fleet=text("varying-cap-fleet"),
        drift_fleet=text("drift-fleet"),
        drift_check_every=_drift_check_every(f, where),
        drift_threshold=run_value(m, "drift-threshold", where),
        cell_timeout_s=integer("cell-timeout-s", 1),
        balance_fleets=_fleet_list(f, "balance-fleets"),
        balance_modes=str_list("balance-modes", tuple(BALANCE_MODES)),
        critical_r_arms=_weighted_arms(f, "critical-r-arms"),
    )
    _check_fleets(cfg, where)
    return cfg


def _drift_check_every(f: Fields, where: str) -> int:
    """``drift-check-every``: the run setting (checked as a run checks it), and at least 1:
    the drift scenario's "check" variant checks every this many rounds (0 never would)."""
    value = int(run_value(f.m, "drift-check-every", where))
    if value < 1:
        raise f.err(
            "drift-check-every",
            f"expected an integer ≥ 1 (the drift scenario's check variant checks every this "
            f"many rounds; 0 would never check), got {value!r}",
        )
    return value


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
