"""The documentation keeps up with the code: README.md and docs/*.md.

* docs/configuration.md is what ``fl_client.settings_docs`` writes from the settings table
  now, and every key of the table has a meaning there.
* Every command of a fenced ``bash`` block is checked without running it: ``powerfl …`` is
  parsed by the CLI's own parser (run-setting keys, fleet and experiment files checked too);
  ``python -m <module>`` / ``python <script>.py`` of this repository stops right after its
  argument parser accepted the arguments; ``pytest`` paths must exist; the run-config keys of
  ``flwr run --run-config`` and the node keys of ``flower-supernode --node-config`` must be
  known keys. Other programs (pip, apt-get, systemctl, …) are not checked.
  A line that must not be checked ends with the comment ``# unchecked: <why>``.
* Every relative link (and its ``#anchor``, for Markdown targets) resolves.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import runpy
import shlex
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fl_client import settings_docs, settings_table
from fl_client.setting_checks import Integer
from fl_client.settings import METHODS, MODEL_NAMES, RunSettings, node_entry_keys
from fl_client.settings_table import BALANCE_MODES, Setting

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
SHELL_FENCES = ("bash", "sh", "shell")
SKIP_MARK = "# unchecked:"
REPO_PACKAGES = ("fl_client", "fl_server", "strategies", "simulations", "deploy", "benchmarks")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ------------------------------------------------------------------ configuration reference


def test_a_setting_without_a_meaning_cannot_be_declared() -> None:
    with pytest.raises(ValueError, match="widget-count"):
        Setting("widget-count", int, 3, Integer(lo=0), "  ")
    with pytest.raises(ValueError, match="widget_count"):
        Setting("widget_count", int, 3, Integer(lo=0), "how many widgets a node keeps")


def test_configuration_page_is_generated_from_the_table() -> None:
    page = settings_docs.DOC_PATH
    current = page.read_text(encoding="utf-8") if page.is_file() else ""
    assert current == settings_docs.render(), (
        f"{_rel(page)} differs from what the settings table gives now; regenerate it with "
        f"`{settings_docs.COMMAND}` (do not edit it by hand)"
    )


def test_configuration_page_lists_every_key() -> None:
    text = settings_docs.render()
    for key in (*RunSettings.keys(), *node_entry_keys()):
        assert f"| `{key}` |" in text, key


def test_a_key_added_to_the_table_is_documented(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new entry shows up on the page with its type, default, allowed values and meaning,
    and the page in the repository is then out of date."""
    extra = Setting(
        "widget-count", int, 3, Integer(lo=1), "how many widgets a node keeps", read_by="node"
    )
    monkeypatch.setattr(settings_docs, "RUN_SETTINGS", (*settings_table.RUN_SETTINGS, extra))
    rows = {key: row for key, *row in settings_docs.run_settings_rows()}
    assert rows["widget-count"] == [
        "integer",
        "`3`",
        "an integer ≥ 1",
        "node",
        "how many widgets a node keeps",
    ]
    assert "| `widget-count` | integer | `3` | an integer ≥ 1 | node |" in settings_docs.render()
    assert settings_docs.main(["--check"]) == 1


def test_the_page_shows_what_each_check_allows() -> None:
    """The "allowed" column is the check's own words, and the node table gives a run+node
    key's default as the run's."""
    rows = {key: row for key, *row in settings_docs.run_settings_rows()}
    assert rows["cap-margin"][:4] == ["number", "`0.05`", "a number in [0, 1)", "both"]
    assert rows["balance"][2] == " \\| ".join(f"`{m}`" for m in BALANCE_MODES)
    assert rows["num-rounds"][2] == "an integer ≥ 1"
    nodes = {key: row for key, *row in settings_docs.node_rows()}
    assert nodes["cap-margin"][1] == "the run's `cap-margin`"
    assert nodes["device"][1] == "required"


def test_the_generator_checks_without_writing(tmp_path: Path) -> None:
    out = tmp_path / "configuration.md"
    assert settings_docs.main(["--check", "--out", str(out)]) == 1
    assert not out.exists()
    assert settings_docs.main(["--out", str(out)]) == 0
    assert settings_docs.main(["--check", "--out", str(out)]) == 0


# ------------------------------------------------------------------------------ commands


@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{_rel(self.page)}:{self.line}: {shlex.join(self.argv)}"


def _fenced_blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(info string, first line number, lines) of every fenced block."""
    info: str | None = None
    start = 0
    body: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        fence = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", line)
        if fence and info is None:
            info, start, body = fence.group(2), number + 1, []
        elif fence and info is not None:
            yield info, start, body
            info = None
        elif info is not None:
            body.append(line)


def _logical_lines(lines: list[str], first: int) -> Iterator[tuple[int, str]]:
    """Lines with their ``\\`` continuations joined, and their first line number."""
    buf, at = "", first
    for offset, line in enumerate(lines):
        if not buf:
            at = first + offset
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        yield at, buf + line
        buf = ""
    if buf:
        yield at, buf


_SEPARATORS = {"&&", "||", ";", "|", "&"}
_REDIRECT = re.compile(r"^\d*(>>?|<)(&\d*)?$|^\d*>>?&?[^<>]+$")


def _simple_commands(line: str) -> Iterator[list[str]]:
    """The simple commands of a shell line: split at ``&&``/``;``/``|``, comments and
    redirections dropped, ``sudo`` and ``VAR=value`` prefixes removed."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return
    current: list[str] = []
    for word in [*words, ";"]:
        if word in _SEPARATORS:
            while current and (current[0] == "sudo" or re.match(r"^\w+=", current[0])):
                current.pop(0)
            if current:
                yield current
            current = []
        elif _REDIRECT.match(word):
            current.append(">")
        else:
            current.append(word)


def doc_commands() -> list[Command]:
    out = []
    for page in PAGES:
        for info, first, lines in _fenced_blocks(page.read_text(encoding="utf-8")):
            if info not in SHELL_FENCES:
                continue
            for number, line in _logical_lines(lines, first):
                if SKIP_MARK in line:
                    continue
                for words in _simple_commands(line):
                    if ">" in words:  # what follows a redirection is not an argument
                        words = words[: words.index(">")]
                    out.append(Command(page, number, tuple(words)))
    return out


COMMANDS = doc_commands()


def _program(cmd: Command) -> str:
    return Path(cmd.argv[0]).name


def _checked(cmd: Command) -> bool:
    program = _program(cmd)
    if program in ("flwr", "flower-supernode"):  # Flower's CLIs: only powerfl's keys in them
        return "--run-config" in cmd.argv or "--node-config" in cmd.argv
    return program in ("powerfl", "pytest") or program.startswith("python")


def test_the_pages_have_commands_to_check() -> None:
    programs = {_program(c) for c in COMMANDS}
    assert {"powerfl", "python", "pytest"} <= programs, programs
    pages = {c.page.name for c in COMMANDS if _program(c) == "powerfl"}
    assert {"README.md", "experiments.md", "jetson-setup.md", "simulation.md"} <= pages


def test_quick_start_is_main_job_then_tests() -> None:
    """CI (.ci/run) runs the second command of the README's first Quick start block."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Quick start\n", 1)[1]
    info, _, lines = next(_fenced_blocks(section))
    commands = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    assert info == "bash" and len(commands) == 2, commands
    assert commands[0].endswith(".venv/bin/powerfl simulate")
    assert commands[1].endswith(".venv/bin/pytest -q")


def _placeholder(value: str) -> bool:
    return "<" in value or "$" in value


def _check_powerfl(args: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    from simulations.cli import build_parser, parse_overrides

    try:
        ns = build_parser(args).parse_args(args)
    except SystemExit as exc:
        if exc.code in (0, None):  # --help
            return []
        return [capsys.readouterr().err.strip().splitlines()[-1]]
    problems = []
    if ns.command == "simulate":
        keys = set(RunSettings.keys())
        problems += [
            f"-c {key}: not a run setting"
            for key in parse_overrides(ns.run_config or [])
            if key not in keys
        ]
        for method in (ns.methods or "").split(","):
            if method and method not in METHODS:
                problems.append(f"--methods: unknown method {method}")
        if ns.model and ns.model not in MODEL_NAMES:
            problems.append(f"--model: unknown model {ns.model}")
        if ns.fleet and not _placeholder(ns.fleet) and not (REPO / ns.fleet).is_file():
            problems.append(f"--fleet: no file {ns.fleet}")
    running_a_study = ns.command == "experiment" and ns.experiment_command == "run"
    if running_a_study and not (REPO / ns.experiment).is_file():
        problems.append(f"no experiment file {ns.experiment}")
    return problems


class _ParsedError(Exception):
    """Raised right after an argument parser accepted the arguments: nothing runs."""


def _check_python(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> list[str]:
    if not args or args[0] == "-c":
        return []
    if args[0] == "-m":
        module, rest = args[1], args[2:]
        if module.split(".")[0] not in REPO_PACKAGES:
            return [] if importlib.util.find_spec(module) else [f"no module {module}"]
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            return [f"no module {module}"]
        source = Path(spec.origin)
    else:
        source, rest = REPO / args[0], args[1:]
        if not source.is_file():
            return [f"no script {args[0]}"]
    if "argparse" not in source.read_text(encoding="utf-8"):
        return []  # no parser to stop at: running it would do the work
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *a: object, **k: object) -> None:
        raise _ParsedError(parse_args(self, *a, **k))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [str(source), *rest])
    monkeypatch.syspath_prepend(str(REPO if args[0] == "-m" else source.parent))  # as python does
    try:
        with warnings.catch_warnings():  # a module imported already runs again: intended
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
            if args[0] == "-m":
                runpy.run_module(args[1], run_name="__main__", alter_sys=False)
            else:
                runpy.run_path(str(source), run_name="__main__")
    except _ParsedError:
        return []
    except SystemExit as exc:
        if exc.code in (0, None):
            return []
        return [capsys.readouterr().err.strip().splitlines()[-1]]
    return ["its argument parser was never reached"]


def _check_pytest(args: list[str]) -> list[str]:
    paths = [a.split("::")[0] for a in args if not a.startswith("-")]
    marker_args = {args[i + 1] for i, a in enumerate(args[:-1]) if a == "-m"}
    return [f"no test path {p}" for p in paths if p not in marker_args and not (REPO / p).exists()]


def _option_value(args: list[str], option: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def _config_keys(value: str) -> list[str]:
    """The keys of Flower's ``key=value key=value`` config strings."""
    return [item.split("=", 1)[0] for item in shlex.split(value) if "=" in item]


def _check_flower(program: str, args: list[str]) -> list[str]:
    if program == "flwr" and args[:1] == ["run"]:
        value = _option_value(args, "--run-config")
        known = set(RunSettings.keys())
        return [
            f"--run-config {key}: not a run setting"
            for key in _config_keys(value or "")
            if key not in known
        ]
    if program == "flower-supernode":
        value = _option_value(args, "--node-config")
        known = set(node_entry_keys())
        return [
            f"--node-config {key}: not a fleet-entry key"
            for key in _config_keys(value or "")
            if key not in known
        ]
    return []


def check_command(
    argv: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> list[str]:
    """What is wrong with a documented command (empty: nothing found)."""
    program, args = Path(argv[0]).name, list(argv[1:])
    if program == "powerfl":
        return _check_powerfl(args, capsys)
    if program.startswith("python"):
        return _check_python(args, monkeypatch, capsys)
    if program == "pytest":
        return _check_pytest(args)
    return _check_flower(program, args)


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if _checked(c)], ids=lambda c: str(c)[:120])
def test_documented_command_parses(
    cmd: Command, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    problems = check_command(cmd.argv, monkeypatch, capsys)
    assert not problems, f"{cmd}\n  " + "\n  ".join(problems)


@pytest.mark.parametrize(
    "line",
    [
        ".venv/bin/powerfl simulate --flet fl_client/configs/fleets/default.toml",
        ".venv/bin/powerfl simulate -c cap-margn=0.1",
        ".venv/bin/powerfl simulate --methods power-aware,b3",
        ".venv/bin/powerfl simulate --fleet fl_client/configs/fleets/missing.toml",
        ".venv/bin/powerfl experiment run fl_client/configs/experiments/missing.toml",
        ".venv/bin/powerfl profile --model cnn",
        ".venv/bin/python benchmarks/bench_runs.py --only fleet7",
        ".venv/bin/python benchmarks/bench_missing.py",
        ".venv/bin/python -m deploy.credentials --frobnicate nano-1",
        ".venv/bin/python -m fl_client.settings_docs --chek",
        ".venv/bin/pytest tests/missing_test.py",
        "flwr run . lab --run-config 'num-round=3'",
        "sudo flower-supernode --node-config 'device=\"jetson-nano\" p-max_w=4.5' > n.log 2>&1 &",
    ],
)
def test_a_wrong_command_is_caught(
    line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (argv,) = [tuple(words) for words in _simple_commands(line)]
    if ">" in argv:
        argv = argv[: argv.index(">")]
    assert check_command(argv, monkeypatch, capsys)


def test_commands_are_split_like_a_shell_would() -> None:
    line = "python3 -m venv .venv && FOO=1 sudo .venv/bin/powerfl devices --json > out 2>&1 &"
    assert list(_simple_commands(line)) == [
        ["python3", "-m", "venv", ".venv"],
        [".venv/bin/powerfl", "devices", "--json", ">", "out", ">"],
    ]
    block = ["powerfl simulate \\", "    --rounds 2   # two", "powerfl devices"]
    assert list(_logical_lines(block, 10)) == [
        (10, "powerfl simulate      --rounds 2   # two"),
        (12, "powerfl devices"),
    ]


# --------------------------------------------------------------------------------- links


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _prose(text: str, code_spans: bool = False) -> str:
    """``text`` without fenced blocks, and without inline code spans unless asked."""
    out, fenced = [], False
    for line in text.splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line if code_spans else re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def anchors(page: Path) -> set[str]:
    """Every ``#anchor`` of a Markdown page's headings (``-1``, ``-2`` for repeats)."""
    seen: dict[str, int] = {}
    for line in _prose(page.read_text(encoding="utf-8"), code_spans=True).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = github_slug(heading.group(1))
            seen[slug] = seen.get(slug, -1) + 1
    found = set()
    for slug, repeats in seen.items():
        found.add(slug)
        found.update(f"{slug}-{n}" for n in range(1, repeats + 1))
    return found


def relative_links(page: Path) -> Iterator[tuple[int, str]]:
    """(line, target) of every link that is not a URL, outside code."""
    for number, line in enumerate(_prose(page.read_text(encoding="utf-8")).splitlines(), 1):
        targets = re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line)
        targets += re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", line)
        for target in targets:
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # not http:, mailto:, …
                yield number, target


def broken_links(page: Path) -> list[str]:
    broken = []
    for number, target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.name}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where}: no heading #{anchor} in {dest.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, "\n".join(broken)


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A node's round\n\n## A node's round\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\nok: [a](other.md#a-nodes-round), [b](other.md#a-nodes-round-1), [c](#page),\n"
        "[d](https://example.org/missing.md), `[e](missing.md)`\n\n"
        "bad: [f](missing.md), [g](other.md#no-such-heading), [h](#nowhere)\n"
    )
    assert [b.split(": ", 2)[1] for b in broken_links(page)] == [
        "missing.md",
        "other.md#no-such-heading",
        "#nowhere",
    ]
