"""ClientApp: Flower handlers only; the work is in ``fl_client.node``."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from fl_client.node import describe_node, profile_cells, train_node

log = logging.getLogger(__name__)

# Error code of a reply whose handler raised: the reason carries the exception's message.
CLIENT_ERROR_CODE = 1


def reply_errors(
    handler: Callable[[Message, Context], Message],
) -> Callable[[Message, Context], Message]:
    """Turn an exception in a handler into an error reply with a one-line reason.

    The server then records why this node has no update (e.g. a cap below the lowest power
    the device can train at) and the round goes on with the others.
    """

    @functools.wraps(handler)
    def wrapped(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except Exception as err:
            log.exception("%s handler failed", msg.metadata.message_type)
            reason = f"{type(err).__name__}: {err}"
            return Message(Error(code=CLIENT_ERROR_CODE, reason=reason), reply_to=msg)

    return wrapped


def make_client_app(overrides: Mapping[str, Any] | None = None) -> ClientApp:
    """A ClientApp; ``overrides`` (used by ``powerfl simulate``) win over run_config."""
    client_app = ClientApp()

    def run_config(context: Context) -> dict[str, Any]:
        return {**dict(context.run_config), **dict(overrides or {})}

    @client_app.query()
    @reply_errors
    def query(msg: Message, context: Context) -> Message:
        config = dict(msg.content["config"])
        info = describe_node(run_config(context), dict(context.node_config), config)
        return Message(RecordDict({"device": ConfigRecord(info.to_config())}), reply_to=msg)

    def trained(msg: Message, context: Context, work: Callable[..., Any]) -> Message:
        """Run ``work`` (a TRAIN round, or a profiling slice) on the message's config and
        arrays; reply with the new arrays and the report as metrics."""
        config = dict(msg.content["config"])
        state = msg.content["arrays"].to_torch_state_dict()  # type: ignore[union-attr]
        new_state, report = work(run_config(context), dict(context.node_config), config, state)
        content = RecordDict(
            {
                "arrays": ArrayRecord(new_state),
                "metrics": MetricRecord(dict[str, Any](report.to_metrics())),
            }
        )
        return Message(content, reply_to=msg)

    @client_app.train()
    @reply_errors
    def train(msg: Message, context: Context) -> Message:
        return trained(msg, context, train_node)

    @client_app.train("profile")
    @reply_errors
    def profile(msg: Message, context: Context) -> Message:
        """Fleet-shared profiling: measure this node's slice of its kind's LUT."""
        return trained(msg, context, profile_cells)

    return client_app


app = make_client_app()
