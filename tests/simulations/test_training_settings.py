"""The run settings a federated study gives every cell (``training_settings``): each is
checked by its entry in the settings table, so a study refuses a bad value with the run's
own words, and a value a run takes is taken the same way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fl_client.settings import RunSettings, SettingsError
from fl_client.settings_table import RUN
from simulations.experiments.config import ExperimentConfigError
from simulations.experiments.registry import load_config
from simulations.experiments.robustness_config import RobustnessConfig
from simulations.experiments.training_settings import TRAINING_DEFAULTS, TRAINING_KEYS

#: A study file of each kind that uses the shared settings, less the key under test.
STUDIES = ("federated", "federated-robustness")

#: Bad values of run settings a study also sets, as written in a TOML file and as Python.
BAD = [
    ("num-rounds", "0", 0),
    ("target-accuracy", "1.5", 1.5),
    ("dirichlet-alpha", "-0.5", -0.5),
    ("local-epochs", "2.5", 2.5),
    ("lr-ref", '"fast"', "fast"),
    ("b-ref", "0", 0),
    ("batch-sizes", "[64, 16]", [64, 16]),
    ("partitioning", '"shards"', "shards"),
    ("profile-grid", '"some"', "some"),
    ("model", '"vgg"', "vgg"),
]


def _study_file(tmp_path: Path, study: str, line: str) -> Path:
    path = tmp_path / f"{study}.toml"
    path.write_text(f'[experiment]\nname = "t"\nstudy = "{study}"\n{line}\n', encoding="utf-8")
    return path


def _run_error(key: str, value: object) -> str:
    """What a run says of ``key = value``."""
    with pytest.raises(SettingsError) as err:
        RunSettings.from_config({key: value})
    return str(err.value)


@pytest.mark.parametrize("study", STUDIES)
@pytest.mark.parametrize(("key", "toml", "value"), BAD)
def test_a_bad_run_setting_in_a_study_is_refused_with_the_runs_words(
    tmp_path: Path, study: str, key: str, toml: str, value: object
) -> None:
    path = _study_file(tmp_path, study, f"{key} = {toml}")
    with pytest.raises(ExperimentConfigError) as err:
        load_config(path)
    run_says = _run_error(key, value)
    assert run_says.startswith(f"{key}: ")  # names the key, and what the run allows
    assert str(err.value) == f"{path}: {run_says}"


@pytest.mark.parametrize(
    ("key", "toml", "allowed"),
    [
        ("num-rounds", "0", "an integer ≥ 1"),
        ("target-accuracy", "0", "in (0.0, 1.0]"),
        ("dirichlet-alpha", "0", "a finite number > 0.0"),
    ],
)
def test_the_refusal_names_the_runs_allowed_range(
    tmp_path: Path, key: str, toml: str, allowed: str
) -> None:
    assert allowed in RUN[key].check.allowed()  # the run's own rule, in words
    for study in STUDIES:
        with pytest.raises(ExperimentConfigError, match=f"{key}: .*{re.escape(allowed)}"):
            load_config(_study_file(tmp_path, study, f"{key} = {toml}"))


def test_the_federated_studys_other_run_settings_are_checked_as_a_run_checks_them(
    tmp_path: Path,
) -> None:
    for key, toml, value in (("deadline-margin", "1.0", 1.0), ("drift-threshold", "0", 0)):
        path = _study_file(tmp_path, "federated", f"{key} = {toml}")
        with pytest.raises(ExperimentConfigError) as err:
            load_config(path)
        assert str(err.value) == f"{path}: {_run_error(key, value)}"


def test_a_study_takes_the_runs_defaults_and_what_a_run_takes(tmp_path: Path) -> None:
    assert {k: TRAINING_DEFAULTS[k] for k in TRAINING_KEYS if k != "batch-sizes"} == {
        k: RUN[k].default for k in TRAINING_KEYS if k != "batch-sizes"
    }
    assert TRAINING_DEFAULTS["batch-sizes"] == RUN["batch-sizes"].value
    lines = 'num-rounds = 3\ntarget-accuracy = 1.0\nbatch-sizes = [8, 16]\nmodel = "resnet18"'
    cfg = load_config(_study_file(tmp_path, "federated-robustness", lines))
    assert isinstance(cfg, RobustnessConfig)
    assert (cfg.num_rounds, cfg.target_accuracy, cfg.model) == (3, 1.0, "resnet18")
    overrides = cfg.base_overrides()
    assert overrides["batch-sizes"] == "8,16" and overrides["num-rounds"] == 3
    run = RunSettings.from_config({k: v for k, v in overrides.items() if k != "pacing"})
    assert (run.num_rounds, run.batch_sizes, run.model) == (3, [8, 16], "resnet18")
