"""Each request's id: the client's own where it is a plausible one, else one made here. It goes
into every log line about the request and the answer's x-request-id, errors included."""

from __future__ import annotations

import itertools
import os
import re
import secrets
from collections.abc import Mapping

from gateway import headers

_CLIENT_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
_ID_PREFIX = secrets.token_hex(6)
_id_counter = itertools.count(1)


def _new_id_prefix() -> None:
    global _ID_PREFIX
    _ID_PREFIX = secrets.token_hex(6)


# Worker processes (serve --workers) are forked after this import: each needs its own prefix.
os.register_at_fork(after_in_child=_new_id_prefix)


def request_id(sent: Mapping[str, str]) -> str:
    """The client's own id if it is a plausible one (it goes into logs and headers);
    otherwise one is made: unique across processes by the random prefix, within one by the
    counter, with no syscall per request, unlike uuid4."""
    own = sent.get(headers.REQUEST_ID)
    if own is not None and _CLIENT_ID.fullmatch(own):
        return own
    return f"{_ID_PREFIX}{next(_id_counter):010x}"
