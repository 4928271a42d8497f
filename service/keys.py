"""Typed keys of what the service keeps on a request (aiohttp's ``RequestKey``)."""

from __future__ import annotations

from aiohttp import web

from .auth import Principal

__all__ = ["PRINCIPAL", "TOKENS_GENERATION"]

#: the caller, as the tokens said when the request was checked (SVC-48)
PRINCIPAL = web.RequestKey("principal", Principal)
#: the tokens' generation that check saw: a stream rechecks once it moves (SVC-49)
TOKENS_GENERATION = web.RequestKey("tokens_generation", int)
