"""The wheel carries the app's pyproject.toml, so its run defaults are written once.

``[tool.flwr.app.config]`` in pyproject.toml is where ``flwr run`` reads the run defaults;
``powerfl`` installed from a wheel has no source tree, so the build copies the file into
the ``configs`` package (``configs/app/pyproject.toml``, read by ``fl_client.shipped``).
Everything else about the build is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithAppConfig(build_py):
    """``build_py`` that also copies pyproject.toml into the built ``configs`` package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the source tree's pyproject.toml
        dst = Path(self.build_lib) / "configs" / "app" / "pyproject.toml"
        dst.parent.mkdir(parents=True, exist_ok=True)
        self.copy_file("pyproject.toml", str(dst))


setup(cmdclass={"build_py": BuildWithAppConfig})
