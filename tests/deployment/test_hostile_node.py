"""A hostile SuperNode in a real Flower deployment on 127.0.0.1 cannot write outside the
server's folders, and the run goes on without it.

Two registered SuperNodes (TLS, node auth, as in ``test_loopback``): a good one, and one
whose ClientApp is altered (a ``sitecustomize`` on its ``PYTHONPATH``, as a modified node
binary would be) so that its QUERY reply names it and its device kind ``../../escaped``.
The server builds file names from a node's device kind (its LUT library,
``fl_server.lut_library``): with the name taken as it came, the kind's LUT would be written
two folders above the library. Checked: the reply is refused with a logged reason naming
the key (the node is left out like a failing node), nothing named after it is written
anywhere, and the run finishes with the good node.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deployment.test_loopback import Federation, open_federation

pytestmark = pytest.mark.slow

HOSTILE = "../../escaped"
#: name -> (device kind, cap in W), as the nodes' own node configs say
NODES = {"good": ("jetson-nano", 5.0), "hostile": ("jetson-tx2-nx", 7.5)}
RUN_CONFIG = {
    "aggregation": '"fedavg"',  # synchronous rounds: the test counts them
    "model": '"cnn"',
    "local-epochs": "1",
    "batch-sizes": '"32,64"',
    "proxy-target-accuracy": "0.5",
    "target-accuracy": "1.0",
    "min-train-nodes": "1",
    "num-rounds": "1",
    "round-timeout-s": "120.0",
}
#: What the hostile node's Python runs first: once ``fl_client.contract`` is imported, its
#: QUERY reply carries ``HOSTILE`` as the node's name and device kind.
SITECUSTOMIZE = f"""
import importlib.abc
import importlib.util
import sys

HOSTILE = {HOSTILE!r}


class _Hostile(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "fl_client.contract":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            to_config = module.NodeDescriptor.to_config
            module.NodeDescriptor.to_config = lambda self: {{
                **to_config(self), "node-name": HOSTILE, "device": HOSTILE
            }}

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Hostile())
"""


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Federation, Path]]:
    root = tmp_path_factory.mktemp("hostile")
    with open_federation(root, list(NODES)) as fed:
        patch = root / "hostile-site"
        patch.mkdir()
        (patch / "sitecustomize.py").write_text(SITECUSTOMIZE)
        path = os.pathsep.join(p for p in (str(patch), fed.env.get("PYTHONPATH", "")) if p)
        fed.start_supernode("good", nodes=NODES)
        fed.start_supernode("hostile", nodes=NODES, env={**fed.env, "PYTHONPATH": path})
        fed.wait_online(set(fed.node_ids.values()))
        out = root / "out"
        run_id = fed.run(out, RUN_CONFIG)
        status, run_dir = fed.wait_finished(run_id, out, timeout=900)
        assert status == "finished:completed", fed.log("superlink")[-4000:]
        yield fed, run_dir


def test_a_hostile_nodes_names_are_refused_and_nothing_is_written_outside(
    hostile_run: tuple[Federation, Path],
) -> None:
    fed, run_dir = hostile_run
    # nothing named after the hostile name anywhere under the federation's folder (the
    # library is <root>/cache/library; "../../escaped" would land in <root>)
    escaped = [p for p in fed.root.rglob("*") if "escaped" in p.name]
    assert escaped == [], escaped
    library = fed.root / "cache" / "library"
    assert all(p.parent == library for p in library.rglob("*.json")), list(library.rglob("*"))
    # the reply was refused as malformed, naming the key, the value and what is allowed
    fleet = json.loads((run_dir / "fleet.json").read_text())
    hostile_id = str(fed.node_ids["hostile"])
    assert set(fleet["query-failures"]) == {hostile_id}, fleet
    reason = fleet["query-failures"][hostile_id]
    assert "malformed QUERY reply" in reason and "cannot be used as a name" in reason, reason
    assert [d["node-name"] for d in fleet["nodes"].values()] == ["good"]


def test_the_run_finishes_with_the_good_node(hostile_run: tuple[Federation, Path]) -> None:
    _, run_dir = hostile_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 1
    assert summary["nodes"]["good"]["rounds-ok"] == 1
    rows = [json.loads(line) for line in (run_dir / "nodes.jsonl").read_text().splitlines()]
    assert {r["node-name"] for r in rows if r["ok"]} == {"good"}
