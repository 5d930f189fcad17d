"""What the package ships: the device twins, example fleets, replay tables and experiment
files of the top-level ``configs`` package, and the app's run defaults.

Everything is found with ``importlib.resources``, so a wheel install works from any folder.
The packages must be installed unpacked (pip does), since the files are handed on as paths.

The run defaults are written once, in ``[tool.flwr.app.config]`` of the source tree's
``pyproject.toml`` (where ``flwr run`` reads them). A wheel carries that same file, copied
into ``configs/app/pyproject.toml`` when the wheel is built (``setup.py``);
``app_pyproject()`` reads the source tree's file when there is one, else the wheel's copy.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

#: The import package that holds the shipped files (the top-level ``configs/``).
SHIPPED = "configs"
#: The app's pyproject.toml as a wheel carries it, inside ``SHIPPED`` (``setup.py`` copies
#: it at build time).
PACKAGED_PYPROJECT = ("app", "pyproject.toml")
#: The distribution's name (``pyproject.toml``'s ``[project] name``).
DISTRIBUTION = "powerfl"


def _package_dir(package: str) -> Path:
    root = importlib.resources.files(package)
    if not isinstance(root, Path):  # a zip import: the shipped files have no path
        raise RuntimeError(
            "powerfl must be installed unpacked (pip install does); its package data is "
            f"read as files, found {root!r}"
        )
    return root


def package_root() -> Path:
    """The ``fl_client`` package's folder."""
    return _package_dir("fl_client")


def configs_root() -> Path:
    """The ``configs`` package's folder: the shipped files."""
    return _package_dir(SHIPPED)


def shipped_dir(*parts: str) -> Path:
    """``configs/<parts>``: e.g. ``shipped_dir("devices")``."""
    return configs_root().joinpath(*parts)


def shipped_names(kind: str) -> tuple[str, ...]:
    """The stems of the shipped ``*.toml`` files of ``kind`` (``fleets``, ``experiments``)."""
    folder = shipped_dir(kind)
    if not folder.is_dir():
        return ()
    return tuple(sorted(p.stem for p in folder.glob("*.toml")))


def shipped_file(kind: str, name: str) -> Path | None:
    """A shipped file given by name (``default`` or ``default.toml`` for
    ``configs/fleets/default.toml``); None when ``name`` is a path (it has a folder part)
    or no shipped file has that name."""
    if not name or Path(name).name != name:
        return None
    path = shipped_dir(kind) / (name if name.endswith(".toml") else f"{name}.toml")
    return path if path.is_file() else None


def source_tree() -> Path | None:
    """The source checkout this package runs from (editable install, ``pythonpath``), or
    None for an installed wheel: the folder above ``configs`` with powerfl's pyproject."""
    root = configs_root().parent
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        head = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    return root if f'name = "{DISTRIBUTION}"' in head else None


def app_pyproject() -> Path | None:
    """The app's pyproject.toml: the source tree's, else the copy a wheel carries; None
    when neither is there (a wheel built without the copy)."""
    tree = source_tree()
    if tree is not None:
        return tree / "pyproject.toml"
    path = configs_root().joinpath(*PACKAGED_PYPROJECT)
    return path if path.is_file() else None
