"""The one registry of studies: ``study = NAME`` in an experiment file → its ``Study``.

A new kind of study is a module with a ``Study`` (``simulations.experiments.study``) and one
line here; the command and the report dispatch through ``get_study`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fl_client.devices import key_hint
from simulations.experiments import (
    federated,
    finetune,
    proxy_sensitivity,
    robustness,
    single_device,
)
from simulations.experiments.config import (
    ExperimentConfigError,
    FileOptions,
    config_error,
    read_experiment_file,
    unknown_keys_error,
)
from simulations.experiments.study import Study

#: Every study an experiment file may name, by name.
STUDIES: dict[str, Study[Any]] = {
    s.name: s
    for s in (
        single_device.STUDY,
        federated.STUDY,
        proxy_sensitivity.STUDY,
        finetune.STUDY,
        robustness.STUDY,
    )
}


def get_study(name: object, where: str = "study") -> Study[Any]:
    """The study called ``name``; an unknown name is an error listing the known ones."""
    study = STUDIES.get(str(name))
    if study is None:
        raise ExperimentConfigError(
            f"{where}: unknown value {name!r}; allowed: {', '.join(STUDIES)}"
        )
    return study


def study_for(data: Mapping[str, Any], where: str) -> Study[Any]:
    """The study a parsed experiment file names in ``[experiment]``."""
    base = data.get("experiment")
    if not isinstance(base, Mapping):
        misspelt = sorted(set(data) - {"experiment", "scale"})
        if misspelt:  # e.g. [experiement]
            raise unknown_keys_error(
                misspelt, ("experiment", "scale"), f"{where}:", "top-level table(s)"
            )
        raise ExperimentConfigError(f"{where}: missing the [experiment] table")
    if base.get("study") is None:
        near = [k for k in base if key_hint(str(k), ("study",)).startswith(" (did you mean")]
        if near:  # e.g. stduy = "federated"
            raise unknown_keys_error(near[:1], ("study",), f"{where}: [experiment]")
        raise config_error(where, "study", f"required key missing; allowed: {', '.join(STUDIES)}")
    return get_study(base["study"], f"{where}: study")


def load_config(path: str | Path, options: FileOptions | None = None) -> Any:
    """Read and validate the experiment file ``path`` of any study; its config."""
    data, where = read_experiment_file(path)
    return study_for(data, where).parse(data, where, options or FileOptions())
