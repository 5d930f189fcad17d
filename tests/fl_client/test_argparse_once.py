"""``fl_client.argparse_once``: one rule for every command line of the project, ``powerfl``
(pinned in ``tests/simulations/test_cli.py``) and the scripts under ``deploy/`` and
``benchmarks/``: an option that takes one value, given twice with two values, exits 2
naming it (argparse kept the last one without a word)."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fl_client.argparse_once import OnceParser

REPO = Path(__file__).resolve().parents[2]

#: Every script with a parser: (path, arguments before the repeated option, an option that
#: takes one value, two valid values of it)
SCRIPTS = [
    ("deploy/connection.py", ["lab"], "--address", "10.0.0.1:8000", "10.0.0.2:8000"),
    ("deploy/credentials.py", [], "--out", "a", "b"),
    ("benchmarks/bench_cell_overhead.py", [], "--windows", "5", "20"),
    ("benchmarks/bench_lut_fit.py", [], "--seeds", "1", "2"),
    ("benchmarks/bench_model_step.py", [], "--models", "cnn", "resnet18"),
    ("benchmarks/bench_runs.py", [], "--only", "default", "fleet100"),
    ("benchmarks/bench_selector.py", [], "--calls", "1", "2"),
    ("benchmarks/bench_shared.py", [], "--seed-cells", "4", "8"),
    ("benchmarks/bench_trace_replay.py", [], "--passes", "1", "2"),
    ("benchmarks/bench_train_step.py", [], "--repeats", "3", "5"),
    ("benchmarks/bench_transfer.py", [], "--model", "cnn", "resnet18"),
    ("benchmarks/bench_twin_energy.py", [], "--models", "cnn", "resnet18"),
    ("benchmarks/bench_update_norms.py", [], "--seed", "1", "2"),
]


def test_every_script_with_a_parser_is_in_the_table() -> None:
    """A new script's parser is checked too: the table must name it."""
    makes_a_parser = re.compile(r"\b(?:ArgumentParser|OnceParser)\(")
    found = {
        str(p.relative_to(REPO))
        for folder in ("deploy", "benchmarks")
        for p in (REPO / folder).glob("*.py")
        if makes_a_parser.search(p.read_text(encoding="utf-8"))
    }
    assert found == {script for script, *_ in SCRIPTS}


class ParsedWithoutAnError(Exception):
    """Raised where parsing succeeded: the script's work never starts in this test."""


def _load(script: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    path = Path(script)
    if path.parts[0] == "benchmarks":  # run as scripts: their folder is on sys.path
        monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
        return importlib.import_module(path.stem)
    return importlib.import_module(".".join(path.with_suffix("").parts))


@pytest.mark.parametrize(
    ("script", "before", "option", "a", "b"), SCRIPTS, ids=[s[0] for s in SCRIPTS]
)
def test_an_option_given_twice_with_two_values_exits_2_naming_it(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    script: str,
    before: list[str],
    option: str,
    a: str,
    b: str,
) -> None:
    module = _load(script, monkeypatch)
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *args: Any, **kw: Any) -> None:
        raise ParsedWithoutAnError(vars(real(self, *args, **kw)))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [script, *before, option, a, option, b])
    with pytest.raises(SystemExit) as stop:
        module.main()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {option}: given twice (" in err and "give it once" in err


def test_the_same_value_twice_is_accepted_and_the_namespace_holds_the_options_only() -> None:
    """``vars(args)`` is written out by some scripts: no bookkeeping of its own in it."""
    parser = OnceParser(prog="p")
    parser.add_argument("--top")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--out")
    run.add_argument("--tag", action="append", default=[])
    args = parser.parse_args(
        ["--top", "x", "--top", "x", "run", "--out", "o", "--out", "o", "--tag", "1", "--tag", "2"]
    )
    assert vars(args) == {"top": "x", "command": "run", "out": "o", "tag": ["1", "2"]}
