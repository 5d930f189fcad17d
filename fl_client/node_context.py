"""A node's context: its run and node settings parsed once per run, its device, its data
and its workload; and what a round spends outside training. No Flower import."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_client import data_splits, model_zoo
from fl_client.devices import Device, Workload, open_device
from fl_client.selector import Objective
from fl_client.settings import NodeSettings, RunSettings, load_fleet, node_settings, resolve_path
from fl_client.settings_table import device_options

# A Jetson's CPU and GPU share memory: leave half of it to the OS, CUDA and the data.
MEMORY_SHARE_FOR_TRAINING = 0.5


@dataclass(frozen=True)
class NodeContext:
    """This node's validated settings, parsed once per run (not once per message)."""

    settings: RunSettings
    node: NodeSettings
    partition_id: int
    num_partitions: int
    cache_dir: Path

    @property
    def cap_margin(self) -> float:
        """This node's ``cap-margin`` if it has one, else the run setting."""
        return self.settings.cap_margin if self.node.cap_margin is None else self.node.cap_margin

    @property
    def objective(self) -> Objective:
        """Eq. 4 with the run settings ``peak-sigma-k`` and ``tie-tolerance``: the node's
        objective, which its ``balance`` mode and the pace-setter's role change."""
        s = self.settings
        return Objective(peak_sigma_k=s.peak_sigma_k, tie_tolerance=s.tie_tolerance)

    def local_data(self) -> tuple[Any, Any]:
        """This node's (training, validation) split of the run's data."""
        spec = data_splits.PartitionSpec.of(self.settings)
        return data_splits.client_data(self.partition_id, self.num_partitions, spec=spec)

    def open_device(self, server_round: int = 0) -> Device:
        return open_device(
            self.node.device,
            self.node.backend,
            seed=self.settings.seed * 1000 + self.partition_id,
            options=device_options(self.node.options).at_round(server_round),
        )


def node_context(run_config: Mapping[str, Any], node_config: Mapping[str, Any]) -> NodeContext:
    """Validated run settings and this node's settings (from node_config or the fleet).

    Cached on the content of both configs: a simulated node gets a message per round, and a
    real SuperNode's ClientApp process may serve several, so settings, pyproject.toml and
    the fleet file are read once per run and process.
    """
    key = json.dumps([dict(run_config), dict(node_config)], sort_keys=True, default=str)
    return _node_context_cached(key)


@functools.lru_cache(maxsize=64)
def _node_context_cached(key: str) -> NodeContext:
    run_config, node_config = json.loads(key)
    settings = RunSettings.from_config(run_config)
    fleet = None if "device" in node_config else load_fleet(settings.fleet)
    node, pid, num = node_settings(node_config, fleet)
    cache_dir = resolve_path(settings.cache_dir) / "nodes" / node.name
    return NodeContext(settings, node, pid, num, cache_dir)


@functools.lru_cache(maxsize=8)
def workload_for(model_name: str) -> Workload:
    """Model, input shape, FLOPs per sample and parameter count of ``model_name``."""
    shape = model_zoo.input_shape_for(model_name)
    return Workload(
        model_name=model_name,
        input_shape=shape,
        flops_per_sample=model_zoo.train_flops_per_sample(model_name, shape),
        param_count=model_zoo.param_count(model_zoo.build_model(model_name)),
    )


def max_batch_size(model_name: str, batch_sizes: list[int], memory_bytes: int) -> int:
    """Largest b in ``batch_sizes`` whose training footprint fits the device (0 if none)."""
    model = model_zoo.build_model(model_name)
    shape = model_zoo.input_shape_for(model_name)
    budget = MEMORY_SHARE_FOR_TRAINING * memory_bytes
    fitting = [
        b for b in batch_sizes if model_zoo.estimate_train_memory_bytes(model, shape, b) <= budget
    ]
    return max(fitting, default=0)


def idle_power_w(device: Device) -> float:
    """The board's idle power in W where the backend knows it (the twin's descriptor), else NaN.

    It prices the time a node waits for the slowest one at the end of a synchronous round.
    """
    spec = getattr(device, "spec", None)
    value = getattr(spec, "idle_power_w", None)
    return float(value) if isinstance(value, (int, float)) else math.nan


@dataclass
class RoundCost:
    """Device time and energy a round spends outside training (profiling of any kind)."""

    time_s: float = 0.0
    energy_j: float = 0.0

    def add(self, time_s: float, energy_j: float) -> None:
        self.time_s += time_s
        self.energy_j += energy_j
