"""The studies' progress display: a rich bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)


class Progress:
    """A rich bar over units of work on a terminal (or forced), plain log lines otherwise."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        from rich.console import Console

        self._bar: Any = None
        console = Console(stderr=True)
        self.console = console
        if enabled and total > 0:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as RichProgress,
            )

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
            )
            self._task = self._bar.add_task("experiment", total=total, detail="")

    @contextmanager
    def running(self) -> Iterator[Progress]:
        if self._bar is not None:
            self._bar.start()
        try:
            yield self
        finally:
            if self._bar is not None:
                self._bar.stop()

    def start(self, description: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=description, detail="")

    def detail(self, text: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, detail=text)

    def done(self, line: str) -> None:
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
            self._bar.advance(self._task)
        else:
            log.info(line)
