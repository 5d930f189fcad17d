"""One progress display for long work (r estimation, the studies): a rich bar on stderr,
plain log lines otherwise.

The bar counts units of work (``total``) and shows a line of detail for the unit running;
each finished unit prints one line above the bar, or logs it when there is no bar.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_log = logging.getLogger(__name__)


class ProgressBar:
    """A rich bar over ``total`` units of work on stderr, or log lines to ``logger``.

    Parameters
    ----------
    total : int
        Units of work; no bar for none.
    enabled : bool
        False: no bar, log lines only.
    title : str
        The bar's description until the first ``start``.
    terminal_only : bool
        Show the bar only when stderr is a terminal (else a bar whenever enabled).
    remaining : bool
        Also show the estimated time remaining.
    logger : logging.Logger, optional
        Where finished units are logged when there is no bar (default: this module's).
    """

    def __init__(
        self,
        total: int,
        *,
        enabled: bool = True,
        title: str = "",
        terminal_only: bool = False,
        remaining: bool = True,
        logger: logging.Logger | None = None,
    ) -> None:
        from rich.console import Console

        self._log = logger if logger is not None else _log
        self._bar: Any = None
        self._task: Any = None
        self.console = Console(stderr=True)
        if enabled and total > 0 and (self.console.is_terminal or not terminal_only):
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                ProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            columns: list[ProgressColumn] = [
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
            ]
            if remaining:
                columns.append(TimeRemainingColumn())
            self._bar = Progress(*columns, console=self.console)
            self._task = self._bar.add_task(title, total=total, detail="")

    @contextmanager
    def running(self) -> Iterator[ProgressBar]:
        """The bar on screen inside the block (nothing to do without one)."""
        if self._bar is not None:
            self._bar.start()
        try:
            yield self
        finally:
            if self._bar is not None:
                self._bar.stop()

    def start(self, description: str, detail: str = "") -> None:
        """A unit of work begins: the bar's description, and its first line of detail."""
        if self._bar is not None:
            self._bar.update(self._task, description=description, detail=detail)

    def detail(self, text: str) -> None:
        """The running unit's detail (e.g. samples so far)."""
        if self._bar is not None:
            self._bar.update(self._task, detail=text)

    def done(self, line: str) -> None:
        """A unit of work finished: ``line`` above the bar, or logged without one."""
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
            self._bar.advance(self._task)
        else:
            self._log.info(line)

    def report(self, line: str) -> None:
        """A closing summary: above the bar when there is one, and always logged."""
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        self._log.info(line)
