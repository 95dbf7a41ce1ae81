"""``OutageLog``: how a background loop that polls storage reports an outage — once."""

from __future__ import annotations

import logging
import time
from typing import Any

from titan.errors import TitanError


class OutageLog:
    """One warning when a loop's calls to the store start failing, one info line when they work
    again, debug lines in between: an outage of ten minutes must not write a line per poll.
    ``num_failures`` (in a row) also drives the loop's backoff. For every loop that polls
    storage: job workers, job-queue upkeep, the retention sweep."""

    def __init__(
        self, what: str, logger: logging.Logger, extra: dict[str, Any] | None = None
    ) -> None:
        self.what = what
        self.logger = logger
        self.extra = extra or {}
        self.num_failures = 0
        self._since = 0.0

    def failed(self, exc: BaseException) -> None:
        self.num_failures += 1
        if self.num_failures > 1:
            self.logger.debug("%s failed again (%d in a row): %s", self.what,
                              self.num_failures, exc, extra=self.extra)  # fmt: skip
            return
        self._since = time.monotonic()
        # A Titan error (the store is unavailable, full) says all; anything else needs its trace.
        self.logger.warning("%s failed: %s; retrying with backoff, quiet until it works again",
                       self.what, exc, exc_info=not isinstance(exc, TitanError),
                       extra=self.extra)  # fmt: skip

    def succeeded(self) -> None:
        if self.num_failures:
            self.logger.info("%s works again, after %d failures over %.1f s", self.what,
                        self.num_failures, time.monotonic() - self._since,
                        extra=self.extra)  # fmt: skip
            self.num_failures = 0

    def backoff_s(self, base_s: float, max_s: float) -> float:
        """``base_s`` while calls succeed; doubling with each failure in a row, up to ``max_s``."""
        if not self.num_failures:
            return base_s
        return min(max_s, max(base_s, base_s * 2 ** min(self.num_failures, 30)))
