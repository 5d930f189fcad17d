"""What one node does for the server: describe itself, and profile → select → lock → train.

No Flower import: ``client_app.py`` unpacks messages and calls these two functions, so they
are tested directly and run the same in simulation and on a real Jetson.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fl_client import selector, task
from fl_client.devices import Device, DeviceOptions, Workload, cap_guard, locked, open_device
from fl_client.profiler import LUT, load_or_profile
from fl_client.settings import (
    NodeSettings,
    RunSettings,
    SettingsError,
    load_fleet,
    node_settings,
    parse_batch_sizes,
    resolve_path,
)

log = logging.getLogger(__name__)

#: Methods that select from the profiled LUTs; B1, B2 and fixed use fixed rules and never
#: profile, so a comparison charges profiling only to the methods that need it.
NEEDS_LUT = ("power-aware", "oracle")

# A Jetson's CPU and GPU share memory: leave half of it to the OS, CUDA and the data.
MEMORY_SHARE_FOR_TRAINING = 0.5


@dataclass(frozen=True)
class NodeContext:
    settings: RunSettings
    node: NodeSettings
    partition_id: int
    num_partitions: int
    cache_dir: Path


def node_context(run_config: Mapping[str, Any], node_config: Mapping[str, Any]) -> NodeContext:
    """Validated run settings and this node's settings (from node_config or the fleet)."""
    settings = RunSettings.from_config(run_config)
    fleet = None if "device" in node_config else load_fleet(settings.fleet)
    node, pid, num = node_settings(node_config, fleet)
    cache_dir = resolve_path(settings.cache_dir) / "nodes" / node.name
    return NodeContext(settings, node, pid, num, cache_dir)


def _open(ctx: NodeContext) -> Device:
    return open_device(
        ctx.node.device,
        ctx.node.backend,
        seed=ctx.settings.seed * 1000 + ctx.partition_id,
        options=DeviceOptions.from_config(ctx.node.options),
    )


def _workload(model_name: str) -> Workload:
    return Workload(
        model_name=model_name,
        input_shape=task.IMAGE_SHAPE,
        flops_per_sample=task.train_flops_per_sample(model_name, task.IMAGE_SHAPE),
        param_count=task.param_count(task.build_model(model_name)),
    )


def max_batch_size(model_name: str, batch_sizes: list[int], memory_bytes: int) -> int:
    """Largest b in ``batch_sizes`` whose training footprint fits the device (0 if none)."""
    model = task.build_model(model_name)
    budget = MEMORY_SHARE_FOR_TRAINING * memory_bytes
    fitting = [
        b
        for b in batch_sizes
        if task.estimate_train_memory_bytes(model, task.IMAGE_SHAPE, b) <= budget
    ]
    return max(fitting, default=0)


def describe_node(
    run_config: Mapping[str, Any], node_config: Mapping[str, Any], query: Mapping[str, Any]
) -> dict[str, Any]:
    """The QUERY reply: device descriptor, cap, and the largest batch size that fits."""
    ctx = node_context(run_config, node_config)
    model_name = str(query.get("model", ctx.settings.model))
    batch_sizes = parse_batch_sizes(query.get("batch-sizes", ctx.settings.batch_sizes))
    device = _open(ctx)
    try:
        info = device.info
    finally:
        device.close()
    return {
        "node-name": ctx.node.name,
        "partition-id": ctx.partition_id,
        "device": info.kind,
        "backend": info.backend,
        "p-max-w": ctx.node.p_max_w,
        "p-max-label": ctx.node.p_max_label,
        "gpu-freqs-mhz": [float(f) for f in info.gpu_freqs_mhz],
        "memory-bytes": int(info.memory_bytes),
        "power-rail": info.power_rail,
        "max-batch-size": max_batch_size(model_name, batch_sizes, info.memory_bytes),
    }


def b1_freq_cap_mhz(device: Device, p_max_w: float) -> float:
    """The device's fixed safe frequency for the cap's band (B1/B2's state of practice)."""
    info = device.info
    try:
        from fl_client.devices.simulated import load_device_spec

        return float(load_device_spec(info.kind).b1_freq_cap_mhz(p_max_w))
    except (ValueError, FileNotFoundError):
        log.warning("no B1 frequency bands for %s: using its highest frequency", info.kind)
        return float(max(info.gpu_freqs_mhz))


def _oracle_r(
    ctx: NodeContext,
    model_name: str,
    state: Mapping[str, torch.Tensor],
    batch_sizes: list[int],
    train_data: Any,
    val_data: Any,
) -> list[float]:
    """r measured on this node's own data (the oracle): computed once, kept on disk."""
    from strategies.r_estimation import estimate_r

    key = f"oracle-r-{model_name}-{'-'.join(map(str, batch_sizes))}.json"
    path = ctx.cache_dir / key
    if path.is_file():
        try:
            return [float(x) for x in json.loads(path.read_text())["r"]]
        except (ValueError, KeyError, TypeError):
            log.warning("corrupt oracle r cache %s: recomputing", path)
    s = ctx.settings
    est = estimate_r(
        model_name,
        dict(state),
        train_data,
        val_data,
        batch_sizes,
        target_accuracy=s.proxy_target_accuracy,
        lr_ref=s.lr_ref,
        b_ref=s.b_ref,
        eval_every_samples=int(s.extra.get("eval-every-samples", 256)),
        max_samples=int(s.extra.get("max-samples", 40_000)),
        seeds=(s.seed,),
        cache_dir=ctx.cache_dir / "r",
        progress=False,
    )
    # Batch sizes that never reach the target on this node's data get r = 1 (the worst).
    r_by_b = dict(zip(est.batch_sizes, est.r, strict=True))
    r = [float(r_by_b.get(b, 1.0)) for b in batch_sizes]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"batch-sizes": batch_sizes, "r": r}))
    return r


def train_node(
    run_config: Mapping[str, Any],
    node_config: Mapping[str, Any],
    config: Mapping[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    step_hook: Callable[[], None] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, float], dict[str, Any]]:
    """One TRAIN round on this node.

    Profile once (LUTs cached on disk), select (b*, f*) with the round's ``method`` under
    this node's P_max, lock the GPU at f*, train ``local-epochs`` with b*, restore the GPU.
    Returns the new weights, the metrics of DESIGN §5 and what was chosen.
    """
    ctx = node_context(run_config, node_config)
    s = ctx.settings
    method = str(config.get("method", s.method))
    if method not in selector.METHODS:
        raise SettingsError(
            f"method: unknown value {method!r}; allowed: {', '.join(selector.METHODS)}"
        )
    model_name = str(config.get("model", s.model))
    batch_sizes = parse_batch_sizes(config.get("batch-sizes", s.batch_sizes))
    r = selector.validate_r([float(x) for x in config["r"]], batch_sizes)
    p_max_w = ctx.node.p_max_w
    lr_ref = float(config.get("lr-ref", s.lr_ref))
    b_ref = int(config.get("b-ref", s.b_ref))
    local_epochs = int(config.get("local-epochs", s.local_epochs))
    server_round = int(config.get("server-round", 0))
    torch.set_num_threads(1)  # simulated nodes share the host's cores

    train_data, val_data = task.client_data(
        ctx.partition_id,
        ctx.num_partitions,
        partitioning=s.partitioning,
        alpha=s.dirichlet_alpha,
        seed=s.seed,
    )
    device = _open(ctx)
    try:
        workload = _workload(model_name)
        lut: LUT | None = None
        profile_time_s = profile_energy_j = 0.0
        from_cache = False
        if method in NEEDS_LUT:
            lut, from_cache = load_or_profile(
                device,
                workload,
                batch_sizes,
                lambda b: task.make_train_step(model_name, task.IMAGE_SHAPE, b),
                ctx.cache_dir / "lut",
                p_max_w=None if math.isinf(p_max_w) else p_max_w,
                uncapped="full" if s.profile_grid == "full" else "highest",
                progress=False,
            )
            if not from_cache:
                profile_time_s, profile_energy_j = lut.profile_time_s, lut.profile_energy_j
        r_true = (
            _oracle_r(ctx, model_name, state, batch_sizes, train_data, val_data)
            if method == "oracle"
            else None
        )
        choice = _select(method, lut, batch_sizes, r, r_true, p_max_w, device, config)

        model = task.build_model(model_name)
        model.load_state_dict(dict(state))
        lr = task.scaled_lr(lr_ref, b_ref, choice.batch_size)
        with (
            locked(device, choice.freq_mhz),
            cap_guard(device, p_max_w),
            device.measure(workload) as meter,
        ):
            result = task.train(
                model,
                train_data,
                batch_size=choice.batch_size,
                lr=lr,
                epochs=local_epochs,
                seed=s.seed * 10_000 + server_round,
                step_runner=meter.step,
            )
            if step_hook is not None:
                step_hook()
        m = meter.measurement
    finally:
        device.close()

    metrics = {
        "num-examples": float(len(train_data)),
        "train-time-s": m.time_s,
        "energy-j": m.energy_j,
        "avg-power-w": m.avg_power_w,
        "peak-power-w": m.peak_power_w,
        "p-max-w": p_max_w,
        "batch-size": float(choice.batch_size),
        "gpu-freq-mhz": float(choice.freq_mhz),
        "profile-time-s": profile_time_s,
        "profile-energy-j": profile_energy_j,
        # The cap guard's step-downs: power above P_max for longer than its window.
        "cap-violations": float(m.cap_violations),
        "time-over-cap-s": float(m.time_over_cap_s),
        "train-loss": float(result.mean_loss),
    }
    if lut is not None:  # what the LUT predicted for this local work
        metrics["predicted-time-s"] = choice.time_per_sample_s * result.samples
    info = {
        "node-name": ctx.node.name,
        "device": device.info.kind,
        "method": method,
        "lut-from-cache": bool(from_cache),
    }
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, metrics, info


def _select(
    method: str,
    lut: LUT | None,
    batch_sizes: list[int],
    r: list[float],
    r_true: list[float] | None,
    p_max_w: float,
    device: Device,
    config: Mapping[str, Any],
) -> selector.Selection:
    freqs_mhz = [float(f) for f in device.gpu_freqs_mhz]
    lut_time_s = None if lut is None else lut.time_per_sample_s
    lut_power_w = None if lut is None else lut.peak_power_w
    if method == "power-aware":
        assert lut_time_s is not None and lut_power_w is not None
        return selector.select_power_aware(
            lut_time_s, lut_power_w, batch_sizes, freqs_mhz, r=r, p_max_w=p_max_w
        )
    if method == "oracle":
        assert r_true is not None and lut_time_s is not None and lut_power_w is not None
        return selector.select_oracle(
            lut_time_s, lut_power_w, batch_sizes, freqs_mhz, r=r_true, p_max_w=p_max_w
        )
    if method in ("b1", "b2"):
        cap = b1_freq_cap_mhz(device, p_max_w)
        if method == "b1":
            return selector.select_b1(batch_sizes, freqs_mhz, cap, lut_time_s, lut_power_w)
        return selector.select_b2(batch_sizes, freqs_mhz, r, cap, lut_time_s, lut_power_w)
    return selector.select_fixed(
        int(config["fixed-batch-size"]),
        float(config["fixed-freq-mhz"]),
        batch_sizes,
        freqs_mhz,
        lut_time_s,
        lut_power_w,
    )
