"""The studies' progress display: ``fl_client.progress.ProgressBar`` titled "experiment",
a rich bar on a terminal (or forced), plain log lines otherwise."""

from __future__ import annotations

import logging

from fl_client.progress import ProgressBar

log = logging.getLogger(__name__)


class Progress(ProgressBar):
    """A bar over a study's units of work, with the time remaining; log lines without it."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        super().__init__(total, enabled=enabled, title="experiment", logger=log)
