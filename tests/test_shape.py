""".ci/shape: the size limits of the production code and their ratchet, on small made-up
trees."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load_shape() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("ci_shape", str(REPO / ".ci" / "shape"))
    spec = importlib.util.spec_from_loader("ci_shape", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ci_shape"] = module  # dataclasses look their module up by name
    loader.exec_module(module)
    return module


shape = _load_shape()


def _function(name: str, body_lines: int, params: str = "", indent: str = "") -> str:
    """A function of ``body_lines + 1`` lines (its ``def`` and one line per statement)."""
    return f"{indent}def {name}({params}):\n" + f"{indent}    x = 1\n" * body_lines


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_file_over_700_lines_is_flagged_and_one_of_700_is_not(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"fl_client/big.py": "x = 1\n" * 701, "fl_client/edge.py": "x = 1\n" * 700},
    )
    assert shape.measure(root)["file-lines"] == {"fl_client/big.py": 701}


def test_a_function_over_80_lines_is_flagged_with_its_qualified_name(tmp_path: Path) -> None:
    text = "\n".join(
        [
            _function("long", 80),  # 81 lines
            _function("edge", 79),  # 80 lines
            "class Box:",
            "    def method(self):",
            *["        x = 1"] * 80,
            "def outer():",
            _function("inner", 81, indent="    "),
        ]
    )
    found = shape.measure(_tree(tmp_path, {"strategies/s.py": text}))["function-lines"]
    assert found == {
        "strategies/s.py::long": 81,
        "strategies/s.py::Box.method": 81,
        "strategies/s.py::outer": 83,
        "strategies/s.py::outer.inner": 82,
    }


def test_more_than_six_parameters_is_flagged_self_and_cls_not_counted(tmp_path: Path) -> None:
    text = "\n".join(
        [
            _function("seven", 1, "a, b, c, d, e, f, g"),
            _function("six", 1, "a, b, c, d, e, f"),
            _function("starred", 1, "a, b, c, d, e, *args, **kwargs"),
            _function("keyword_only", 1, "a, b, c, *, d, e, f, g"),
            "class C:",
            _function("method", 1, "self, a, b, c, d, e, f", indent="    "),
            "    @classmethod",
            _function("build", 1, "cls, a, b, c, d, e, f, g", indent="    "),
            "def self_outside_a_class(self, a, b, c, d, e, f):\n    pass",
        ]
    )
    found = shape.measure(_tree(tmp_path, {"fl_server/p.py": text}))["parameters"]
    assert found == {
        "fl_server/p.py::seven": 7,
        "fl_server/p.py::starred": 7,
        "fl_server/p.py::keyword_only": 7,
        "fl_server/p.py::C.build": 7,
        "fl_server/p.py::self_outside_a_class": 7,
    }


def test_kwargs_typed_any_is_flagged_in_every_spelling(tmp_path: Path) -> None:
    text = "\n".join(
        [
            "import typing",
            "from typing import Any",
            "def plain(**kwargs: Any): pass",
            "def dotted(**options: typing.Any): pass",
            "def quoted(**settings: 'Any'): pass",
            "def typed(**kwargs: int): pass",
            "def bare(**kwargs): pass",
        ]
    )
    found = shape.measure(_tree(tmp_path, {"simulations/k.py": text}))["kwargs-any"]
    assert found == {
        "simulations/k.py::plain": 1,
        "simulations/k.py::dotted": 1,
        "simulations/k.py::quoted": 1,
    }


def test_only_production_code_is_measured(tmp_path: Path) -> None:
    big = "x = 1\n" * 900
    root = _tree(
        tmp_path,
        {
            f"{folder}/m.py": big
            for folder in ("tests", "benchmarks", "deploy", "configs", "fl_client/devices")
        },
    )
    assert sorted(shape.measure(root)["file-lines"]) == ["configs/m.py", "fl_client/devices/m.py"]


def test_a_name_written_twice_in_a_file_is_kept_apart(tmp_path: Path) -> None:
    text = _function("twice", 81) + "\n" + _function("twice", 90)
    found = shape.measure(_tree(tmp_path, {"fl_client/t.py": text}))["function-lines"]
    assert found == {"fl_client/t.py::twice": 82, "fl_client/t.py::twice#2": 91}


def test_the_ratchet_fails_new_and_grown_offenders_only() -> None:
    baseline = {"file-lines": {"a.py": 900, "b.py": 800, "c.py": 750, "gone.py": 710}}
    current = {
        "file-lines": {"a.py": 900, "b.py": 801, "c.py": 720, "new.py": 701},
        "parameters": {"a.py::f": 7},
    }
    verdict = shape.compare(current, baseline)
    assert not verdict.ok
    assert verdict.new == [("file-lines", "new.py", 701), ("parameters", "a.py::f", 7)]
    assert verdict.grown == [("file-lines", "b.py", 801, 800)]
    assert verdict.shrunk == [("file-lines", "c.py", 720, 750)]
    assert verdict.gone == [("file-lines", "gone.py", 710)]
    assert shape.compare({"file-lines": {"a.py": 899}}, baseline).ok
    lines = shape.report(verdict)
    assert any(ln.startswith("NEW    parameters: a.py::f: 7") for ln in lines)
    assert any(ln.startswith("GREW   file-lines: b.py: 801") for ln in lines)
    assert "left: 2 file-lines (limit 700), 0 function-lines (limit 80)" in "\n".join(lines)


def test_the_command_checks_and_only_tightens_its_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(tmp_path, {"fl_client/big.py": "x = 1\n" * 750})
    baseline = root / ".ci" / "shape-baseline.json"
    baseline.parent.mkdir()
    assert shape.main(["--root", str(root)]) == 1  # no baseline: every offender is new
    assert shape.main(["--root", str(root), "--update"]) == 0  # the first baseline
    assert json.loads(baseline.read_text())["file-lines"] == {"fl_client/big.py": 750}
    assert shape.main(["--root", str(root)]) == 0

    (root / "fl_client" / "big.py").write_text("x = 1\n" * 751)
    assert shape.main(["--root", str(root)]) == 1
    assert shape.main(["--root", str(root), "--update"]) == 1  # never loosened
    assert json.loads(baseline.read_text())["file-lines"] == {"fl_client/big.py": 750}

    (root / "fl_client" / "big.py").write_text("x = 1\n" * 710)
    assert shape.main(["--root", str(root)]) == 0
    assert "shrank file-lines: fl_client/big.py: 750 -> 710" in capsys.readouterr().out
    assert shape.main(["--root", str(root), "--update"]) == 0
    assert json.loads(baseline.read_text())["file-lines"] == {"fl_client/big.py": 710}


def test_a_baseline_with_an_unknown_check_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"file-lenght": {}}))
    with pytest.raises(SystemExit, match=r"unknown check.*file-lenght.*known: file-lines"):
        shape.read_baseline(path)
