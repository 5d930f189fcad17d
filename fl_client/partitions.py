"""The clients' split of a labelled pool with Flower Datasets' partitioners, and how to show
it: one line per node on the console and a label-distribution plot in the run folder.

The pool stays in memory: its labels (and each sample's position) are wrapped as a
``datasets.Dataset`` that is handed to an ``IidPartitioner``, a ``DirichletPartitioner`` or a
``PathologicalPartitioner`` (``partitioner.dataset = ds``); each node gets the positions of
its samples. No PyTorch and no Flower import; ``flwr_datasets`` (which pulls in
``datasets``, pandas and matplotlib, about two seconds) is imported only when a split is
made or plotted.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fl_client.contract import SettingsError

if TYPE_CHECKING:
    from flwr_datasets.partitioner import Partitioner

#: The ``partitioning`` values: Flower Datasets' partitioner behind each.
PARTITIONINGS = ("dirichlet", "iid", "pathological")
#: Smallest Dirichlet partition accepted before the draw is repeated.
MIN_PARTITION_SIZE = 10
#: Classes each node holds with ``pathological`` unless told otherwise.
CLASSES_PER_NODE = 2
#: Partitioner instances tried (each draws 11 times) before a Dirichlet split is refused;
#: the instance k > 0 is seeded ``seed + k * _SEED_STRIDE``.
_MAX_DIRICHLET_PARTITIONERS = 100
_SEED_STRIDE = 100_003
LABEL = "label"
INDEX = "index"
#: File names of the split report in a run folder.
SPLIT_PLOT = "split.png"
#: Fleets larger than this get split.json only (a bar per node is unreadable beyond it).
MAX_PLOT_NODES = 64
SPLIT_JSON = "split.json"


def _flwr_datasets_quiet() -> None:
    """Flower Datasets reads its telemetry switch when first imported: keep it off unless
    the user turned it on (the project's runs are offline)."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


def check_num_partitions(num_partitions: int, n: int) -> None:
    """``num-partitions`` (the number of nodes) in ``[1, n]``."""
    if not 1 <= num_partitions <= n:
        raise SettingsError(
            f"num-partitions: {num_partitions!r} nodes cannot share {n} samples; "
            f"must be in [1, {n}]"
        )


def check_alpha(alpha: float) -> None:
    """``dirichlet-alpha`` finite and > 0."""
    if not alpha > 0 or not math.isfinite(alpha):
        raise SettingsError(f"dirichlet-alpha: must be > 0, got {alpha!r}")


def _labels_dataset(labels: np.ndarray) -> Any:
    from datasets import Dataset

    return Dataset.from_dict({LABEL: labels.astype(np.int64), INDEX: np.arange(len(labels))})


def _parts_of(partitioner: Partitioner, num_partitions: int) -> list[np.ndarray]:
    with warnings.catch_warnings():
        # The partitioners warn on every repeated draw and on unused classes; the outcome
        # (or our error) says what matters.
        warnings.simplefilter("ignore")
        return [
            np.sort(np.asarray(partitioner.load_partition(i)[INDEX], dtype=np.int64))
            for i in range(num_partitions)
        ]


def _dirichlet(
    ds: Any, num_partitions: int, alpha: float, seed: int, min_size: int
) -> list[np.ndarray]:
    from flwr_datasets.partitioner import DirichletPartitioner

    for k in range(_MAX_DIRICHLET_PARTITIONERS):
        partitioner = DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by=LABEL,
            alpha=float(alpha),
            min_partition_size=min_size,
            self_balancing=True,
            shuffle=False,
            seed=seed + k * _SEED_STRIDE,
        )
        partitioner.dataset = ds
        try:
            return _parts_of(partitioner, num_partitions)
        except ValueError:  # no draw met min_partition_size: try the next instance
            continue
    raise SettingsError(
        f"dirichlet-alpha: no Dirichlet({alpha}) draw in {_MAX_DIRICHLET_PARTITIONERS * 11} "
        f"tries gave every one of {num_partitions} nodes ≥ {min_size} samples; use a larger "
        "dirichlet-alpha or fewer nodes"
    )


def _pathological(
    ds: Any, labels: np.ndarray, num_partitions: int, classes_per_node: int, seed: int
) -> list[np.ndarray]:
    from flwr_datasets.partitioner import PathologicalPartitioner

    num_classes = len(np.unique(labels))
    if not 1 <= classes_per_node <= num_classes:
        raise SettingsError(
            f"classes-per-node: must be in [1, {num_classes}] (the classes of the pool), "
            f"got {classes_per_node!r}"
        )
    partitioner = PathologicalPartitioner(
        num_partitions=num_partitions,
        partition_by=LABEL,
        num_classes_per_partition=classes_per_node,
        class_assignment_mode="first-deterministic",
        shuffle=False,
        seed=seed,
    )
    partitioner.dataset = ds
    try:
        return _parts_of(partitioner, num_partitions)
    except ValueError as err:
        raise SettingsError(
            f"classes-per-node: {num_partitions} nodes with {classes_per_node} classes each "
            f"cannot be served by this pool ({err}); use fewer nodes or classes-per-node"
        ) from None


@dataclass(frozen=True)
class Partitioning:
    """How a pool is split over the nodes: the partitioner and its knobs (the run settings
    ``partitioning``, ``dirichlet-alpha``, ``seed`` and ``classes-per-node``).

    Attributes
    ----------
    partitioning : {"dirichlet", "iid", "pathological"}
        Which partitioner (``PARTITIONINGS``).
    alpha : float
        Dirichlet concentration (``dirichlet-alpha``), > 0; only for ``dirichlet``.
    seed : int
        Seed of the shuffle or of the partitioner's draws.
    min_size : int
        Smallest Dirichlet partition.
    classes_per_node : int
        Classes per node (``classes-per-node``); only for ``pathological``.
    """

    partitioning: str = "dirichlet"
    alpha: float = 0.5
    seed: int = 0
    min_size: int = MIN_PARTITION_SIZE
    classes_per_node: int = CLASSES_PER_NODE

    @property
    def detail(self) -> str:
        """The knobs that shape this split, for a report's title: its own knob
        (``dirichlet-alpha``, ``classes-per-node``) and the seed."""
        own = {
            "dirichlet": f"dirichlet-alpha {self.alpha:g}, ",
            "pathological": f"classes-per-node {self.classes_per_node}, ",
        }.get(self.partitioning, "")
        return f"{own}seed {self.seed}"


def partition(
    labels: np.ndarray | Sequence[int],
    num_partitions: int,
    how: Partitioning = Partitioning(),
) -> list[np.ndarray]:
    """Split a pool over ``num_partitions`` nodes with a Flower Datasets partitioner.

    * ``iid``: the pool shuffled with ``how.seed`` (as ``FederatedDataset`` does), then
      ``IidPartitioner``'s contiguous, near-equal shards;
    * ``dirichlet``: ``DirichletPartitioner`` (label skew, class shares per node from
      Dir(``how.alpha``), self-balancing, every node ≥ ``how.min_size`` samples; the draw
      is repeated, at most 1,100 times, until it is);
    * ``pathological``: ``PathologicalPartitioner`` (each node holds
      ``how.classes_per_node`` classes, the first one assigned deterministically, the
      paper's mode).

    Parameters
    ----------
    labels : array-like of int
        Label of each sample of the pool.
    num_partitions : int
        Number of nodes.
    how : Partitioning
        Which partitioner, and its knobs.

    Returns
    -------
    list of numpy.ndarray
        Sorted int64 positions in ``labels`` for each node; ``iid`` and ``dirichlet`` cover
        the pool exactly once, ``pathological`` may leave classes out.

    Raises
    ------
    fl_client.contract.SettingsError
        A bad setting or a split that leaves a node with no samples; the message names the
        key (``partitioning``, ``num-partitions``, ``dirichlet-alpha``, ``min_size``,
        ``classes-per-node``).
    """
    y = np.asarray(labels)
    _check(len(y), num_partitions, how)
    _flwr_datasets_quiet()
    ds = _labels_dataset(y)
    if how.partitioning == "iid":
        from flwr_datasets.partitioner import IidPartitioner

        iid = IidPartitioner(num_partitions=num_partitions)
        iid.dataset = ds.shuffle(seed=how.seed)
        parts = _parts_of(iid, num_partitions)
    elif how.partitioning == "dirichlet":
        parts = _dirichlet(ds, num_partitions, how.alpha, how.seed, how.min_size)
    else:
        parts = _pathological(ds, y, num_partitions, how.classes_per_node, how.seed)
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        key = {"iid": "num-partitions", "dirichlet": "dirichlet-alpha"}.get(
            how.partitioning, "classes-per-node"
        )
        raise SettingsError(
            f"{key}: the {how.partitioning} split leaves node(s) {', '.join(map(str, empty))} "
            f"of {num_partitions} with no samples"
        )
    return parts


def _check(n: int, num_partitions: int, how: Partitioning) -> None:
    """The settings of ``partition`` for a pool of ``n`` samples."""
    if how.partitioning not in PARTITIONINGS:
        raise SettingsError(
            f"partitioning: unknown value {how.partitioning!r}; allowed: {', '.join(PARTITIONINGS)}"
        )
    if how.partitioning == "dirichlet":
        check_alpha(how.alpha)
    check_num_partitions(num_partitions, n)
    if how.partitioning == "dirichlet" and how.min_size * num_partitions > n:
        raise SettingsError(
            f"min_size: {num_partitions} partitions of at least {how.min_size} samples need "
            f"{how.min_size * num_partitions} samples, only {n} available"
        )


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class SplitReport:
    """Who holds what: each node's label counts (training + local validation data).

    ``counts[i][c]`` is the number of samples of class ``c`` on node ``i``; ``names[i]`` is
    the node's name (its partition id by default).
    """

    dataset: str
    partitioning: str
    detail: str  # e.g. "dirichlet-alpha 0.5, seed 7" (``Partitioning.detail``)
    names: tuple[str, ...]
    counts: tuple[tuple[int, ...], ...]
    class_names: tuple[str, ...]

    @classmethod
    def of(
        cls,
        labels: np.ndarray,
        parts: Sequence[np.ndarray],
        how: Partitioning,
        *,
        dataset: str,
        names: Sequence[str] | None = None,
        class_names: Sequence[str] | None = None,
    ) -> SplitReport:
        """The report of ``parts`` (positions in ``labels``, one array per node), split
        ``how`` from ``dataset``."""
        y = np.asarray(labels, dtype=np.int64)
        k = max(int(y.max()) + 1 if len(y) else 0, len(class_names or ()))
        node_names = tuple(names) if names is not None else tuple(map(str, range(len(parts))))
        if len(node_names) != len(parts):
            raise ValueError(f"names: {len(node_names)} names for {len(parts)} nodes")
        counts = tuple(
            tuple(int(c) for c in np.bincount(y[np.asarray(p, dtype=np.int64)], minlength=k))
            for p in parts
        )
        classes = tuple(class_names) if class_names else tuple(map(str, range(k)))
        return cls(dataset, how.partitioning, how.detail, node_names, counts, classes)

    def sizes(self) -> list[int]:
        """Samples per node."""
        return [sum(c) for c in self.counts]

    def title(self) -> str:
        detail = f", {self.detail}" if self.detail else ""
        return (
            f"{self.dataset} over {len(self.names)} nodes: {self.partitioning}{detail}, "
            f"{sum(self.sizes())} samples"
        )

    def header(self) -> str:
        return f"data split of {self.title()}; label counts of classes {' '.join(self.class_names)}"

    def lines(self, most: int | None = None) -> list[str]:
        """A header, then one line per node: name, samples, label histogram; with ``most``,
        at most that many node lines and one line saying how many more ``split.json``
        holds."""
        width = max(len(n) for n in self.names) if self.names else 4
        cw = max(3, *(len(str(v)) for row in self.counts for v in row)) if self.counts else 3
        out = [self.header()]
        rows = list(zip(self.names, self.counts, strict=True))
        for name, row in rows[:most]:
            hist = " ".join(f"{v:>{cw}d}" for v in row)
            out.append(f"  {name:<{width}}  {sum(row):>6d} samples  [{hist}]")
        if most is not None and len(rows) > most:
            sizes = self.sizes()
            out.append(
                f"  … and {len(rows) - most} more nodes ({min(sizes)}–{max(sizes)} samples "
                f"each; every node in {SPLIT_JSON} in the run folder)"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "partitioning": self.partitioning,
            "detail": self.detail,
            "classes": list(self.class_names),
            "nodes": [
                {"node": n, "samples": sum(row), "label-counts": list(row)}
                for n, row in zip(self.names, self.counts, strict=True)
            ],
        }

    def save(self, folder: str | Path) -> list[Path]:
        """Write ``split.json`` and ``split.png`` (Flower Datasets' per-partition label
        distribution bar plot, one bar per node) into ``folder``; returns their paths."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        data_path = folder / SPLIT_JSON
        data_path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        if len(self.names) > MAX_PLOT_NODES:  # one bar per node stops being readable
            return [data_path]
        plot_path = folder / SPLIT_PLOT
        self.plot(plot_path)
        return [data_path, plot_path]

    def plot(self, path: str | Path) -> Path:
        """The label-distribution plot of the split, saved to ``path``."""
        _flwr_datasets_quiet()
        from flwr_datasets.visualization import plot_label_distributions
        from matplotlib.figure import Figure

        fig = Figure(figsize=(max(6.0, 0.6 * len(self.names) + 3.0), 4.5))
        ax = fig.subplots()
        plot_label_distributions(
            _FixedPartitioner.of(self),
            label_name=LABEL,
            plot_type="bar",
            size_unit="absolute",
            axis=ax,
            title=self.title(),
            legend=True,
            legend_title="label",
            verbose_labels=True,
            legend_kwargs={"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)},
        )
        ax.set_xticks(range(len(self.names)), list(self.names), rotation=30, ha="right")
        ax.set_xlabel("node")
        fig.savefig(path, dpi=120, bbox_inches="tight")
        return Path(path)


def _fixed_partitioner_class() -> type:
    from flwr_datasets.partitioner import Partitioner

    class FixedPartitioner(Partitioner):  # type: ignore[misc, unused-ignore]
        """A partitioner whose partitions are given: node i's samples are ``parts[i]``."""

        def __init__(self, parts: list[list[int]]) -> None:
            super().__init__()
            self._parts = parts

        def load_partition(self, partition_id: int) -> Any:
            return self.dataset.select(self._parts[partition_id])

        @property
        def num_partitions(self) -> int:
            return len(self._parts)

    return FixedPartitioner


class _FixedPartitioner:
    """Builds a Flower Datasets partitioner holding a report's split (labels with ClassLabel
    names, so the plot's legend shows the class names)."""

    @staticmethod
    def of(report: SplitReport) -> Any:
        from datasets import ClassLabel, Dataset, Features, Value

        labels: list[int] = []
        parts: list[list[int]] = []
        for row in report.counts:
            start = len(labels)
            for c, v in enumerate(row):
                labels.extend([c] * v)
            parts.append(list(range(start, len(labels))))
        features = Features(
            {LABEL: ClassLabel(names=list(report.class_names)), INDEX: Value("int64")}
        )
        ds = Dataset.from_dict({LABEL: labels, INDEX: list(range(len(labels)))}, features)
        partitioner = _fixed_partitioner_class()(parts)
        partitioner.dataset = ds
        return partitioner
