"""The ``Study`` protocol every kind of experiment implements (parse / preflight / run / render).

A study is one value of ``study`` in an experiment file's ``[experiment]`` table. The
command (``simulations.experiments.cli``) only talks to this protocol: it asks the registry
(``simulations.experiments.registry``) for the file's study, then parses the file, runs the
pre-flight checks, creates the output folder and its manifest, runs the study and renders
its report. Nothing outside a study's own modules knows its settings or its records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from simulations.experiments.config import FileOptions, StudyConfig

__all__ = ["FileOptions", "Outcome", "Preflight", "RunOptions", "Study", "StudyPlugin"]

ConfigT = TypeVar("ConfigT", bound=StudyConfig)


@dataclass(frozen=True)
class RunOptions:
    """How the command runs a study."""

    progress: bool = True  # a progress bar on the terminal
    only_training: bool = False  # stop after the training runs (studies with that stage)


@dataclass(frozen=True)
class Preflight:
    """What a study checked before any output exists, for the manifest."""

    note: str  # where the data, time and energy come from (the report's data note)
    data_sizes: Mapping[str, Any] | None = None
    torch_device: str | None = None  # where its training runs execute, as recorded


@dataclass(frozen=True)
class Outcome:
    """What a run did: record counts, and whether the study is complete."""

    counts: dict[str, Any] = field(default_factory=dict)
    complete: bool = True
    stage: str | None = None  # a partial run (e.g. "training"): no report yet


@runtime_checkable
class Study(Protocol[ConfigT]):
    """One kind of experiment file.

    Attributes
    ----------
    name : str
        The ``study`` value of ``[experiment]`` it reads.
    has_training_stage : bool
        Whether ``--only-training`` applies (the r-estimation runs can stop there).
    """

    @property
    def name(self) -> str: ...

    @property
    def has_training_stage(self) -> bool: ...

    def parse(self, data: Mapping[str, Any], where: str, options: FileOptions) -> ConfigT:
        """Validate a parsed experiment file; errors name ``where`` and the key."""
        ...

    def preflight(self, cfg: ConfigT, where: str) -> Preflight:
        """Checks that need more than the file (data on disk, a GPU), before any output;
        raises ``ExperimentConfigError``."""
        ...

    def run(self, cfg: ConfigT, out: Path, options: RunOptions) -> Outcome:
        """Compute every record of ``cfg`` missing under ``out`` (resumable)."""
        ...

    def render(self, out: Path) -> Path:
        """Write the report of the output folder ``out`` from its records; return it."""
        ...


@dataclass(frozen=True)
class StudyPlugin(Generic[ConfigT]):
    """A ``Study`` made of its functions: what a study module registers."""

    name: str
    parse: Callable[[Mapping[str, Any], str, FileOptions], ConfigT]
    preflight: Callable[[ConfigT, str], Preflight]
    run: Callable[[ConfigT, Path, RunOptions], Outcome]
    render: Callable[[Path], Path]
    has_training_stage: bool = False
