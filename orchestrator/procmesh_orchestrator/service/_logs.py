"""A log line that a flood of bad requests cannot multiply: one WARNING per interval, with a count."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """At most one WARNING per `interval` seconds; the next one says how many were left out.

    Args:
        logger: Where to log.
        what: The line's fixed first words (no request content goes in a log above DEBUG).
        interval: Seconds between two WARNINGs.
    """

    def __init__(self, logger: logging.Logger, what: str, interval: float = 10.0) -> None:
        self._logger = logger
        self._what = what
        self._interval = interval
        self._next = 0.0
        self._suppressed = 0

    def warning(self, detail: str) -> None:
        """Log `detail` now, or count it and log it at DEBUG when the interval has not passed."""
        now = time.monotonic()
        if now < self._next:
            self._suppressed += 1
            self._logger.debug("%s: %s", self._what, detail)
            return
        more = f" (and {self._suppressed} more since the last one)" if self._suppressed else ""
        self._logger.warning("%s: %s%s", self._what, detail, more)
        self._suppressed = 0
        self._next = now + self._interval
