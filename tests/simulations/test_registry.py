"""The study plugin set: one registry, the command dispatches through it, and the
experiments package keeps its shape (no cycle, no private import, short functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from simulations.cli import main
from simulations.experiments.config import ExperimentConfigError
from simulations.experiments.registry import STUDIES, get_study, load_config, study_for
from simulations.experiments.study import Study

PACKAGE = Path(__file__).resolve().parents[2] / "simulations" / "experiments"
REPO = PACKAGE.parents[1]


def test_every_shipped_experiment_file_names_a_registered_study():
    assert set(STUDIES) == {
        "single-device",
        "federated",
        "proxy-sensitivity",
        "finetune",
        "federated-robustness",
    }
    for path in sorted((REPO / "configs" / "experiments").glob("*.toml")):
        cfg = load_config(path)
        assert get_study(cfg.study).name == cfg.study
    for name, study in STUDIES.items():
        assert isinstance(study, Study) and study.name == name


def test_unknown_or_missing_study_is_an_error_naming_the_choices():
    with pytest.raises(ExperimentConfigError, match="study: unknown value 'weather'; allowed: "):
        study_for({"experiment": {"study": "weather"}}, "f.toml")
    with pytest.raises(ExperimentConfigError, match=r"f\.toml: study: required key missing"):
        study_for({"experiment": {"name": "x"}}, "f.toml")
    with pytest.raises(ExperimentConfigError, match=r"missing the \[experiment\] table"):
        study_for({}, "f.toml")


def test_only_studies_with_a_training_stage_take_only_training(tmp_path, capsys):
    path = REPO / "configs" / "experiments" / "proxy-sensitivity-image.toml"
    rc = main(["experiment", "run", str(path), "--out", str(tmp_path / "o"), "--only-training"])
    assert rc == 2
    assert "--only-training: the proxy-sensitivity study has no separate training stage" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "o").exists()


def test_report_of_an_unknown_study_is_an_error(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text('{"study": "weather", "config": {}}')
    assert main(["experiment", "report", str(tmp_path)]) == 2
    assert "study: unknown value 'weather'" in capsys.readouterr().err


# --------------------------------------------------------------------------- package shape


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text()) for p in sorted(PACKAGE.glob("*.py"))}


def _imports(tree: ast.Module) -> list[ast.ImportFrom]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]


def test_no_import_cycle_and_no_private_name_across_modules():
    prefix = "simulations.experiments"
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, tree in mods.items():
        for node in _imports(tree):
            module = node.module or ""
            targets = [module.removeprefix(prefix + ".")]
            if module == prefix:
                targets = [a.name for a in node.names]
            graph[name] |= {t for t in targets if t in mods}
            if module.startswith((prefix, "fl_")):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{name} imports {private} from {node.module}"

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    assert [m for m in mods if m in reach(m)] == []


def test_no_function_over_100_lines_or_8_parameters():
    long = []
    for name, tree in _modules().items():
        for f in ast.walk(tree):
            if isinstance(f, ast.FunctionDef):
                a = f.args
                n_params = len(a.posonlyargs + a.args + a.kwonlyargs) - (
                    1 if a.args and a.args[0].arg in ("self", "cls") else 0
                )
                if f.end_lineno - f.lineno + 1 > 100 or n_params > 8:  # type: ignore[operator]
                    long.append(f"{name}.{f.name}")
    assert long == []
