"""The ClientApp's handlers called directly with Messages, as a SuperNode would."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from fl_client.client_app import make_client_app
from fl_client.contract import Cap, NodeDescriptor, TrainConfig, TrainReport
from fl_client.model_zoo import build_model

pytestmark = pytest.mark.usefixtures("flower_task_identity")

NODE: dict[str, Any] = {
    "device": "jetson-nano",
    "backend": "simulated",
    "p-max-w": 5.0,
    "partition-id": 0,
    "num-partitions": 4,
}
TEMPLATE = TrainConfig(
    server_round=1,
    method="power-aware",
    model="cnn",
    batch_sizes=(8, 16, 32, 64),
    r=(0.4, 0.5, 0.7, 1.0),
    lr_ref=0.003,
    b_ref=128,
    local_epochs=1,
)


def _context(tmp_path: Path, node_config: dict[str, Any] | None = None) -> Context:
    run_config: dict[str, Any] = {
        "cache-dir": str(tmp_path / "cache"),
        "output-dir": str(tmp_path / "runs"),
    }
    node: dict[str, Any] = dict(node_config or NODE)
    return Context(run_id=1, node_id=7, node_config=node, state=RecordDict(), run_config=run_config)


def _train_message(
    method: str = "power-aware",
    r: list[float] | None = None,
    extra: dict[str, Any] | None = None,
) -> Message:
    """A TRAIN message as the strategy sends it (``r`` unchecked, as a node receives it)."""
    model = build_model("cnn")
    record = dataclasses.replace(TEMPLATE, method=method).to_config()
    if r is not None:
        record["r"] = r
    config = ConfigRecord({**record, **(extra or {})})
    return Message(
        RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": config}),
        message_type=MessageType.TRAIN,
        dst_node_id=7,
    )


def _query_message(config: dict[str, Any]) -> Message:
    return Message(
        RecordDict({"config": ConfigRecord(config)}),
        message_type=MessageType.QUERY,
        dst_node_id=7,
    )


def _reason(reply: Message) -> str:
    """The error reply's reason ("" for a reply without an error)."""
    return str(reply.error.reason) if reply.has_error() else ""


def _descriptor(reply: Message) -> NodeDescriptor:
    assert not reply.has_error(), _reason(reply)
    return NodeDescriptor.from_config(dict(reply.content.config_records["device"]))


def _report(reply: Message) -> TrainReport:
    assert not reply.has_error(), _reason(reply)
    return TrainReport.from_metrics(dict(reply.content.metric_records["metrics"]))


def test_query_reports_device_and_cap(tmp_path: Path) -> None:
    app = make_client_app()
    reply = app(_query_message({"model": "cnn", "batch-sizes": [8, 16]}), _context(tmp_path))
    info = reply.content.config_records["device"]
    assert info["device"] == "jetson-nano" and info["p-max-w"] == 5.0
    assert info["max-batch-size"] == 16
    desc = _descriptor(reply)  # what the strategy parses
    assert desc.p_max == Cap(5.0) and desc.partition_id == 0
    assert 921.6 in desc.knob_values


def test_query_of_an_uncapped_node_says_inf_on_the_wire(tmp_path: Path) -> None:
    node = {k: v for k, v in NODE.items() if k != "p-max-w"}
    reply = make_client_app()(
        _query_message({"model": "cnn", "batch-sizes": [8, 16]}), _context(tmp_path, node)
    )
    wire = reply.content.config_records["device"]["p-max-w"]
    assert isinstance(wire, float) and math.isinf(wire)
    assert _descriptor(reply).p_max == Cap.NONE


def test_query_without_batch_sizes_is_an_error_reply_naming_the_key(tmp_path: Path) -> None:
    reply = make_client_app()(_query_message({"model": "cnn"}), _context(tmp_path))
    assert reply.has_error()
    assert "batch-sizes: missing from the QUERY config" in _reason(reply)


def test_train_profiles_selects_under_cap_and_reports_contract_metrics(tmp_path: Path) -> None:
    app = make_client_app()
    ctx = _context(tmp_path)
    reply = app(_train_message(), ctx)
    assert not reply.has_error(), _reason(reply)
    m = reply.content.metric_records["metrics"]
    for key in TrainReport.required_keys():
        assert key in m, key
    for key in (
        "num-examples",
        "train-time-s",
        "train-energy-j",
        "avg-power-w",
        "peak-power-w",
        "p-max-w",
        "batch-size",
        "gpu-freq-mhz",
        "profile-time-s",
        "profile-energy-j",
        "cap-violations",
    ):
        assert key in m, key
    assert "energy-j" not in m  # one key, one meaning: training and profiling apart
    report = _report(reply)  # what the strategy parses
    assert report.peak_power_w < 5.0 and report.p_max_w == 5.0 and report.cap == Cap(5.0)
    assert report.batch_size in (8, 16, 32, 64)
    assert report.profile_time_s > 0 and report.train_time_s > 0
    assert report.profile_energy_j > 0
    assert report.train_energy_j == pytest.approx(
        report.avg_power_w * report.train_time_s, rel=1e-6
    )
    arrays = reply.content.array_records["arrays"]
    assert len(arrays) == len(build_model("cnn").state_dict())
    # the second round reuses the cached LUT: no profiling cost again
    again = _report(app(_train_message(), ctx))
    assert again.profile_time_s == 0 and again.lut_from_cache == 1.0
    assert list((tmp_path / "cache").rglob("*.json"))


def test_b1_uses_largest_batch_at_safe_frequency(tmp_path: Path) -> None:
    report = _report(make_client_app()(_train_message("b1"), _context(tmp_path)))
    assert report.batch_size == 64 and report.gpu_freq_mhz == pytest.approx(307.2)


def test_bad_r_is_an_error_reply_naming_the_key(tmp_path: Path) -> None:
    reply = make_client_app()(_train_message(r=[0.5, 1.0]), _context(tmp_path))
    assert reply.has_error()
    assert "r: has 2 values but batch-sizes has 4" in _reason(reply)


def test_a_train_config_with_an_unknown_key_is_an_error_reply(tmp_path: Path) -> None:
    message = _train_message(extra={"cap-margin": 0.0})
    reply = make_client_app()(message, _context(tmp_path))
    assert reply.has_error()
    assert "SettingsError: cap-margin: not part of the TRAIN config" in _reason(reply)


def test_cap_below_lowest_power_is_an_error_reply_with_the_power(tmp_path: Path) -> None:
    node = {**NODE, "p-max-w": 0.5}
    reply = make_client_app()(_train_message(), _context(tmp_path, node))
    assert reply.has_error()
    assert "p-max-w" in _reason(reply) and "lowest" in _reason(reply)
