"""Log lines that name their request and never carry a secret.

Every line logged while a request is handled carries its request id (a context variable set
by the app's middleware: each request runs in a task of its own). A redacting filter on the
handler removes credentials from every line, the gateway's own and its libraries' (aiohttp
quotes raw header lines in some of its errors), messages and tracebacks alike.
"""

from __future__ import annotations

import logging
import re
from contextvars import ContextVar

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="-")
FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"

_SECRETS = (
    # A header or field named like a credential: the whole value, scheme included.
    re.compile(
        r"(?i)\b((?:proxy-)?authorization|x-api-key|api[-_]?key|admin[-_]?token)"
        r"(\W{1,4})(?:bearer\s+|basic\s+)?[^\s,;'\"\\]+"
    ),
    re.compile(r"(?i)\b(bearer|basic)(\s+)[^\s,;'\"\\]+"),
)


def redact(text: str) -> str:
    for pattern in _SECRETS:
        text = pattern.sub(r"\1\2[redacted]", text)
    return text


class _RequestContext(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class _Redact(logging.Filter):
    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(self._formatter.formatException(record.exc_info))
        return True


def configure(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(_RequestContext())
    handler.addFilter(_Redact())
    logging.basicConfig(level=level, handlers=[handler], force=True)
