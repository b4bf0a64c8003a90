"""Policy-file section ``session``: how a client names a conversation to keep on its replica
(router_policies/sessions.py); defaults with their reasons."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from router_policies.strict_model import StrictModel


class SessionSettings(StrictModel):
    header: Annotated[str, Field(pattern=r"^[A-Za-z0-9-]*$")] = "x-session-id"
    """Request header naming the session; empty: none is read."""
    body_fields: tuple[str, ...] = ("prompt_cache_key", "user")
    """Request body fields naming it, after the header, first found wins: OpenAI's
    `prompt_cache_key` says exactly this; `user` (a stable end-user id) keeps each user's
    requests together. Empty: only the header."""
    max_sessions: Annotated[int, Field(ge=0)] = 100_000
    """Sessions remembered per pool (about 100 bytes each); 0 turns session affinity off."""
