"""The run settings every cell of a federated study shares (the model, the data split, the
training, the round budget and target, r estimation, profiling), read from an experiment
file. Each is a run setting, parsed and checked by its entry in the settings table
(``fl_client.settings_table.RUN``): a bad value in a study is refused with the words a run
uses for it (its key and what it allows), and its default is the run's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fl_client.contract import SettingsError
from fl_client.settings_table import RUN
from simulations.experiments.config import ExperimentConfigError

#: The run settings of ``TrainingSettings``, in its fields' order.
TRAINING_KEYS = (
    "model",
    "partitioning",
    "dirichlet-alpha",
    "num-rounds",
    "target-accuracy",
    "target-window",
    "local-epochs",
    "batch-sizes",
    "lr-ref",
    "b-ref",
    "proxy-target-accuracy",
    "r-max-samples",
    "r-eval-every-samples",
    "profile-grid",
)
#: Their defaults in an experiment file: the run's (``batch-sizes`` a list, as experiment
#: files write it).
TRAINING_DEFAULTS: dict[str, Any] = {
    **{key: RUN[key].default for key in TRAINING_KEYS},
    "batch-sizes": RUN["batch-sizes"].value,
}


def run_value(m: Mapping[str, Any], key: str, where: str) -> Any:
    """The value of the run setting ``key`` in a study's merged settings ``m``, parsed by
    its entry in the settings table; a bad value is an ExperimentConfigError
    ``<file>: <the run's error>``, which names the key and what the run allows."""
    try:
        return RUN[key].parse(m[key])
    except SettingsError as err:
        raise ExperimentConfigError(f"{where}: {err}") from None


@dataclass(frozen=True)
class TrainingSettings:
    """The run settings a study gives every cell (``TRAINING_KEYS``), checked as a run
    checks them. A study's resolved settings extend it with the study's own keys."""

    model: str
    partitioning: str
    dirichlet_alpha: float
    num_rounds: int
    target_accuracy: float
    target_window: int
    local_epochs: int
    batch_sizes: tuple[int, ...]
    lr_ref: float
    b_ref: int
    proxy_target_accuracy: float
    r_max_samples: int
    r_eval_every_samples: int
    profile_grid: str

    @staticmethod
    def parse_values(m: Mapping[str, Any], where: str) -> dict[str, Any]:
        """The fields' values in a study's merged settings ``m`` (by Python name), each
        parsed by ``run_value``."""
        values = {RUN[key].field_name: run_value(m, key, where) for key in TRAINING_KEYS}
        values["batch_sizes"] = tuple(values["batch_sizes"])
        return values

    def training_overrides(self) -> dict[str, Any]:
        """These settings as a run takes them (``batch-sizes`` comma-separated), each a key
        of the settings table."""
        out = {key: getattr(self, RUN[key].field_name) for key in TRAINING_KEYS}
        out["batch-sizes"] = ",".join(str(b) for b in self.batch_sizes)
        return out
