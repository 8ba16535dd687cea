"""Process logging for every procmesh program: text by default, or one JSON object per line.

The orchestrator, the built-in sidecars, ``procmesh.run`` and the Node SDK share the format, so
one log pipeline (Loki, Cloud Logging, ``jq``) reads all of them: each line is an object with
``time`` (RFC 3339, UTC, milliseconds), ``level``, ``logger`` and ``message``, plus ``run_id`` and
``trace_id`` when the record was logged inside a run (or a traced request), and ``exception``
when it carries a traceback.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import time
from typing import Any, Final, Literal, get_args

LogFormat = Literal["text", "json"]
"""The values of ``--log-format`` / ``PROCMESH_LOG_FORMAT``."""
LOG_FORMATS: Final[tuple[str, ...]] = get_args(LogFormat)

RUN_ID: Final[contextvars.ContextVar[str]] = contextvars.ContextVar("procmesh_run_id", default="")
"""The id of the run being served; the orchestrator sets it for the length of each run."""
TRACE_ID: Final[contextvars.ContextVar[str]] = contextvars.ContextVar("procmesh_trace_id", default="")
"""The W3C trace id (32 hex digits) of the request being served; empty until tracing sets it."""

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line (newlines in messages stay escaped).

    Fields: ``time``, ``level``, ``logger``, ``message``; ``run_id`` and ``trace_id`` only when
    set (`RUN_ID`, `TRACE_ID`); ``exception`` and ``stack`` when the record has them.
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line (without the newline the handler adds)."""
        seconds = time.gmtime(record.created)
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", seconds) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        run_id = RUN_ID.get()
        if run_id:
            entry["run_id"] = run_id
        trace_id = TRACE_ID.get()
        if trace_id:
            entry["trace_id"] = trace_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # default=str: a message argument of any type must not make a log line raise.
        return json.dumps(entry, ensure_ascii=False, default=str)


def _resolve(log_format: str | None) -> LogFormat:
    chosen = log_format if log_format is not None else os.environ.get("PROCMESH_LOG_FORMAT", "text")
    normalized = chosen.strip().lower()
    if normalized == "json":
        return "json"
    if normalized == "text":
        return "text"
    raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)} (got {chosen!r})")


def configure_logging(level: str | int = "INFO", log_format: str | None = None) -> None:
    """Send the root logger's records to stderr, as text or JSON lines, from `level` up.

    Only programs call this (``main()``, ``procmesh.run``); libraries log through
    ``logging.getLogger(__name__)``. Like `logging.basicConfig`, it leaves a root logger that
    already has handlers (a test runner's) alone.

    Args:
        level: A level name (``INFO``) or number.
        log_format: ``text`` or ``json``; None reads ``PROCMESH_LOG_FORMAT`` (default ``text``).

    Raises:
        ValueError: An unknown format or level (the message says which values are valid).
    """
    chosen = _resolve(log_format)
    if isinstance(level, str) and not isinstance(logging.getLevelName(level.upper()), int):
        raise ValueError(f"unknown log level {level!r} (DEBUG, INFO, WARNING, ERROR, CRITICAL)")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if chosen == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper() if isinstance(level, str) else level, handlers=[handler])
    # httpx logs every request it makes at INFO with its URL (a provider's call, the orchestrator's
    # read of its built-in sidecar's metrics every 2 s): a URL may carry a key, and no request
    # content goes in a log above DEBUG. Its lines show at DEBUG only.
    quiet = logging.getLogger().getEffectiveLevel() > logging.DEBUG
    logging.getLogger("httpx").setLevel(logging.WARNING if quiet else logging.NOTSET)
