"""Server logs: levelled, timestamped lines (text or JSON) carrying the request id, and the start-up line.

The servers (``reach gateway``, its workers, ``reach node``) log through the
standard library. :func:`setup_logging` puts one handler on the root logger
whose lines say when (UTC, ISO 8601), how bad, which logger and which request:
the request id is taken from a context variable that :func:`bind_request_id`
sets once a request is admitted. Each request runs in a task of its own (an
ASGI request cycle, a gRPC call), so every line logged while it runs, in its
task, the tasks it starts or the threads it copies its context into, names
it ("-" outside any request). ``json`` writes one object per line for log shippers.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Final, Literal

from reach_plugins.errors import ConfigError

LogFormat = Literal["text", "json"]
FORMATS: Final = ("text", "json")
LEVELS: Final = ("debug", "info", "warning", "error")
NO_REQUEST: Final = "-"
"""The request id of lines logged outside any request."""

REQUEST_ID: ContextVar[str] = ContextVar("reach_log_request_id", default=NO_REQUEST)
TEXT: Final = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


def reach_version() -> str:
    """This installation's version of reach-plugins ("unknown" when run from a tree that is not installed)."""
    try:
        return version("reach-plugins")
    except PackageNotFoundError:  # pragma: no cover - depends on how the tree is installed
        return "unknown"


def bind_request_id(request_id: str) -> None:
    """Every line logged from here to the end of the current task (the request's own) carries ``request_id``."""
    REQUEST_ID.set(request_id)


class RequestIdFilter(logging.Filter):
    """Stamps each record with the current request id (``record.request_id``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


def _utc(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER [REQUEST] message``, the time in UTC (ISO 8601, milliseconds)."""

    def __init__(self) -> None:
        super().__init__(TEXT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _utc(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, request_id, message (and the traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": _utc(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": getattr(record, "request_id", NO_REQUEST),
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup_logging(log_format: str = "text", level: str = "info") -> None:
    """Send every logger's lines (ours, uvicorn's, grpc's) to stderr in ``log_format`` at ``level`` and above.

    Replaces the root logger's handlers, so calling it again (a worker
    process, a test) does not double the lines. ``ConfigError`` for an
    unknown format or level, naming the choices.
    """
    if log_format not in FORMATS:
        raise ConfigError(f"--log-format {log_format!r}: choose one of {', '.join(FORMATS)}")
    if level.lower() not in LEVELS:
        raise ConfigError(f"--log-level {level!r}: choose one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        # uvicorn's own handlers (if a config gave it some) would print the same line twice, unformatted
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True


def security_mode(*, tls: bool, mutual: bool, open_: bool) -> str:
    """How a server checks its callers, for the start-up line: transport (plaintext, tls, mtls) + auth."""
    transport = "mtls" if mutual else "tls" if tls else "plaintext"
    return f"{transport}+{'open' if open_ else 'tenant-tokens'}"


def startup_line(role: str, *, address: str, registry: str | None, tenants: int, security: str, **extra: object) -> str:
    """The one line a server logs once it listens: what runs, which version, where, from which registry, how secured."""
    fields = {
        "version": reach_version(),
        "listen": address,
        "registry": registry or "config file",
        "tenants": tenants,
        "security": security,
        **extra,
    }
    return f"reach {role} started: " + " ".join(f"{key}={value}" for key, value in fields.items())
