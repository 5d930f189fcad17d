"""The ClientApp's handlers called directly with Messages, as a SuperNode would."""

from __future__ import annotations

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from fl_client.client_app import make_client_app
from fl_client.task import build_model

pytestmark = pytest.mark.usefixtures("flower_task_identity")

NODE = {
    "device": "jetson-nano",
    "backend": "simulated",
    "p-max-w": 5.0,
    "partition-id": 0,
    "num-partitions": 4,
}


def _context(tmp_path, node_config=None) -> Context:
    run_config = {"cache-dir": str(tmp_path / "cache"), "output-dir": str(tmp_path / "runs")}
    return Context(
        run_id=1,
        node_id=7,
        node_config=dict(node_config or NODE),
        state=RecordDict(),
        run_config=run_config,
    )


def _train_message(method: str = "power-aware", r=None, batch_sizes=None) -> Message:
    model = build_model("cnn")
    config = ConfigRecord(
        {
            "method": method,
            "batch-sizes": batch_sizes or [8, 16, 32, 64],
            "r": r or [0.4, 0.5, 0.7, 1.0],
            "lr-ref": 0.003,
            "b-ref": 128,
            "local-epochs": 1,
            "server-round": 1,
            "model": "cnn",
        }
    )
    return Message(
        RecordDict({"arrays": ArrayRecord(model.state_dict()), "config": config}),
        message_type=MessageType.TRAIN,
        dst_node_id=7,
    )


def test_query_reports_device_and_cap(tmp_path):
    app = make_client_app()
    msg = Message(
        RecordDict({"config": ConfigRecord({"model": "cnn", "batch-sizes": [8, 16]})}),
        message_type=MessageType.QUERY,
        dst_node_id=7,
    )
    reply = app(msg, _context(tmp_path))
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    info = reply.content["device"]
    assert info["device"] == "jetson-nano" and info["p-max-w"] == 5.0
    assert info["max-batch-size"] == 16
    assert 921.6 in list(info["gpu-freqs-mhz"])


def test_train_profiles_selects_under_cap_and_reports_contract_metrics(tmp_path):
    app = make_client_app()
    ctx = _context(tmp_path)
    reply = app(_train_message(), ctx)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    m = reply.content["metrics"]
    for key in (
        "num-examples",
        "train-time-s",
        "energy-j",
        "avg-power-w",
        "peak-power-w",
        "p-max-w",
        "batch-size",
        "gpu-freq-mhz",
        "profile-time-s",
        "cap-violations",
    ):
        assert key in m, key
    assert m["peak-power-w"] < 5.0 and m["p-max-w"] == 5.0
    assert m["batch-size"] in (8, 16, 32, 64)
    assert m["profile-time-s"] > 0 and m["train-time-s"] > 0
    assert m["energy-j"] == pytest.approx(m["avg-power-w"] * m["train-time-s"], rel=1e-6)
    assert len(reply.content["arrays"]) == len(build_model("cnn").state_dict())
    # the second round reuses the cached LUT: no profiling cost again
    again = app(_train_message(), ctx)
    assert again.content["metrics"]["profile-time-s"] == 0
    assert list((tmp_path / "cache").rglob("*.json"))


def test_b1_uses_largest_batch_at_safe_frequency(tmp_path):
    reply = make_client_app()(_train_message("b1"), _context(tmp_path))
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    m = reply.content["metrics"]
    assert m["batch-size"] == 64 and m["gpu-freq-mhz"] == pytest.approx(307.2)


def test_bad_r_is_an_error_reply_naming_the_key(tmp_path):
    reply = make_client_app()(_train_message(r=[0.5, 1.0]), _context(tmp_path))
    assert reply.has_error() and "r" in reply.error.reason


def test_cap_below_lowest_power_is_an_error_reply_with_the_power(tmp_path):
    node = {**NODE, "p-max-w": 0.5}
    reply = make_client_app()(_train_message(), _context(tmp_path, node))
    assert reply.has_error()
    assert "p-max-w" in reply.error.reason and "lowest" in reply.error.reason
