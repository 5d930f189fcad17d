"""Experiment tracking: a finished run logged to MLflow (``tracking = "mlflow"``).

Each run ``powerfl simulate`` makes (one per method) and each run of a study becomes one
MLflow run, named after its run folder, in the experiment ``powerfl`` of the store at
``tracking-uri`` (empty: a local store in ``output-dir``, ``mlflow.db`` with its files in
``mlartifacts/``). It holds:

* params: the run's settings as the server recorded them (``settings.json``);
* metrics with step = round: every number of ``rounds.jsonl`` (``accuracy``, ``loss``,
  ``sim-time-s``, ``fleet-energy-j``, …);
* metrics ``node/<node>/<total>``: each node's totals over the run (``summary.json`` →
  ``nodes``: ``train-time-s``, ``train-energy-j``, ``idle-energy-j``, …), and
  ``summary/<key>``: the run's headline numbers (``round-to-target``, …);
* artifacts: the run folder's files (JSON records, pictures).

Everything is read from the run folder's records after the run has written them, so
tracking cannot change a run; and it never loses one: a failure costs one warning line,
the run's records stay in its folder, and later runs of the same process skip that store.
``tracking.json`` in the run folder says where its MLflow run is.

MLflow is an optional extra (``pip install 'powerfl[tracking]'``), imported only when a
run is logged. No PyTorch, no Flower.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fl_client.contract import key_of
from fl_client.settings import RunSettings, SettingsError, resolve_path
from simulations.report import load_run

#: The MLflow experiment every powerfl run is logged in.
EXPERIMENT = "powerfl"
#: How to install MLflow with powerfl.
INSTALL = "pip install 'powerfl[tracking]'"
#: The default store, in ``output-dir``: its database and its artifacts' folder.
STORE_DB, ARTIFACTS = "mlflow.db", "mlartifacts"
#: In a tracked run's folder: where its MLflow run is.
TRACKING_RECORD = "tracking.json"
#: A param value longer than this is cut (older MLflow servers refuse longer ones; the whole
#: of ``settings.json`` is an artifact).
MAX_PARAM_CHARS = 500
#: MLflow's limits on one ``log_batch`` call.
PARAMS_PER_BATCH, METRICS_PER_BATCH = 100, 1000
#: An unreachable tracking server costs at most these retries and seconds per request
#: (MLflow's defaults retry for minutes); the environment's own values win.
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}

#: Stores a logging failed for in this process: warned once, not tried again.
_failed: set[str] = set()


@dataclass(frozen=True)
class TrackedRun:
    """Where a run was logged: the store's URI, the experiment and the MLflow run."""

    uri: str
    experiment_id: str
    run_id: str

    def to_record(self) -> dict[str, str]:
        return {
            "tracking": "mlflow",
            "tracking-uri": shown_uri(self.uri),
            "experiment-id": self.experiment_id,
            "run-id": self.run_id,
        }


def check_tracking(settings: RunSettings) -> None:
    """Refuse ``tracking = "mlflow"`` where MLflow is not installed, before any run starts
    (a SettingsError naming the key and the install command)."""
    if settings.tracking == "mlflow" and importlib.util.find_spec("mlflow") is None:
        raise SettingsError(
            f'tracking: "mlflow" needs MLflow, which is not installed: {INSTALL}, or set '
            'tracking = "none"'
        )


def store_uri(settings: RunSettings) -> str:
    """``tracking-uri``, else the local store in ``output-dir`` (``sqlite:///…/mlflow.db``)."""
    if settings.tracking_uri:
        return settings.tracking_uri
    return f"sqlite:///{resolve_path(settings.output_dir) / STORE_DB}"


def artifact_location(settings: RunSettings) -> str | None:
    """Where the experiment keeps its files when this module creates it: ``mlartifacts/``
    beside the local store; a store given by URI keeps them where it is configured to."""
    if settings.tracking_uri:
        return None
    return (resolve_path(settings.output_dir) / ARTIFACTS).as_uri()


def shown_uri(uri: str) -> str:
    """``uri`` without a password (``http://user:***@host``), for messages and records."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


# ------------------------------------------------------------------- what is logged


def run_params(settings_record: Mapping[str, Any]) -> dict[str, str]:
    """The run's settings as MLflow params: kebab-case keys, strings as they are, other
    values as JSON (``true``, ``[4, 8]``, ``null``), cut at ``MAX_PARAM_CHARS``."""
    params = {}
    for name, value in settings_record.items():
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) > MAX_PARAM_CHARS:
            text = text[: MAX_PARAM_CHARS - 1] + "…"
        params[key_of(name)] = text
    return params


def _numbers(record: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """The finite numbers of a record (no booleans, no null)."""
    for key, value in record.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and math.isfinite(value):
            yield key, float(value)


def round_metrics(rounds: Iterable[Mapping[str, Any]]) -> list[tuple[str, float, int]]:
    """(key, value, step = round) for every number of every round record."""
    return [
        (key, value, int(row["server-round"]))
        for row in rounds
        for key, value in _numbers(row)
        if key != "server-round"
    ]


def total_metrics(summary: Mapping[str, Any]) -> list[tuple[str, float, int]]:
    """(key, value, 0): ``node/<node>/<total>`` for each node's totals and
    ``summary/<key>`` for the run's headline numbers."""
    out = [(f"summary/{key}", value, 0) for key, value in _numbers(summary)]
    for node, totals in summary.get("nodes", {}).items():
        out += [(f"node/{node}/{key}", value, 0) for key, value in _numbers(totals)]
    return out


# ------------------------------------------------------------------------ logging


def log_run(settings: RunSettings, run_dir: str | Path) -> TrackedRun | None:
    """Log the finished run in ``run_dir`` to MLflow when ``tracking = "mlflow"``; print
    where. None when it is not tracked, or when logging failed (one warning line; a store
    that failed once in this process is not tried again)."""
    if settings.tracking != "mlflow":
        return None
    uri = store_uri(settings)
    if uri in _failed:
        return None
    folder = Path(run_dir)
    try:
        with _quiet_mlflow():
            tracked = _log(uri, artifact_location(settings), folder)
    except Exception as err:  # the run is done and recorded: say so, never lose it
        _warn(uri, folder, err)
        return None
    print(
        f"  mlflow       run {tracked.run_id} in {shown_uri(uri)} (experiment {EXPERIMENT})",
        flush=True,
    )
    return tracked


def log_pictures(settings: RunSettings, run_dirs: Sequence[str | Path]) -> None:
    """Add the pictures drawn into tracked run folders after they were logged (``simulate``
    draws them once every method has run) to their MLflow runs (``tracking.json``)."""
    if settings.tracking != "mlflow":
        return
    uri = store_uri(settings)
    for run_dir in run_dirs:
        folder = Path(run_dir)
        if uri in _failed or not (folder / TRACKING_RECORD).is_file():
            continue
        try:
            where = json.loads((folder / TRACKING_RECORD).read_text(encoding="utf-8"))
            with _quiet_mlflow():
                client = _client(uri)
                for picture in sorted(folder.glob("*.png")):
                    client.log_artifact(where["run-id"], str(picture))
        except Exception as err:  # the pictures are in the run folder either way
            _warn(uri, folder, err)


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    if uri.startswith(("http://", "https://")):
        for key, value in HTTP_ENV.items():
            os.environ.setdefault(key, value)
    return MlflowClient(tracking_uri=uri)


def _experiment_id(client: Any, location: str | None) -> str:
    """The ``powerfl`` experiment's id, created where it does not exist yet (by another
    process meanwhile too)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(EXPERIMENT)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(EXPERIMENT, artifact_location=location))
    except MlflowException:
        found = client.get_experiment_by_name(EXPERIMENT)
        if found is None:
            raise
        return str(found.experiment_id)


def _log(uri: str, location: str | None, folder: Path) -> TrackedRun:
    """One MLflow run of the finished run in ``folder``: params, metrics, then its files."""
    from mlflow.entities import Metric, Param

    run = load_run(folder)  # the records a report reads, checked
    settings_record = json.loads((folder / "settings.json").read_text(encoding="utf-8"))
    client = _client(uri)
    experiment_id = _experiment_id(client, location)
    tags = {"powerfl.method": run.method, "powerfl.run-dir": str(folder.absolute())}
    run_id = client.create_run(experiment_id, run_name=folder.name, tags=tags).info.run_id
    status = "FAILED"
    try:
        params = [Param(k, v) for k, v in run_params(settings_record).items()]
        now_ms = int(time.time() * 1000)
        metrics = [
            Metric(key, value, now_ms, step)
            for key, value, step in (*round_metrics(run.rounds), *total_metrics(run.summary))
        ]
        for at in range(0, len(params), PARAMS_PER_BATCH):
            client.log_batch(run_id, params=params[at : at + PARAMS_PER_BATCH])
        for at in range(0, len(metrics), METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=metrics[at : at + METRICS_PER_BATCH])
        tracked = TrackedRun(uri, experiment_id, run_id)
        (folder / TRACKING_RECORD).write_text(
            json.dumps(tracked.to_record(), indent=2) + "\n", encoding="utf-8"
        )
        client.log_artifacts(run_id, str(folder))
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status)
    return tracked


@contextlib.contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """MLflow's and its database migrations' info lines and warnings kept off the run's
    console (a failure still raises)."""
    loggers = [logging.getLogger(name) for name in ("mlflow", "alembic")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _warn(uri: str, folder: Path, err: BaseException) -> None:
    """One warning line for a store that failed; it is not tried again in this process."""
    _failed.add(uri)
    reason = (str(err).strip().splitlines() or [""])[0]
    reason = reason if len(reason) <= 300 else reason[:299] + "…"
    print(
        f"powerfl: warning: tracking: {folder} was not logged to MLflow at {shown_uri(uri)} "
        f"({type(err).__name__}: {reason}); the run and its records are in its folder, and "
        "no further run of this command is logged there",
        file=sys.stderr,
        flush=True,
    )
