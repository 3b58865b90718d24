"""A request body read whole under a size cap, for both HTTP ports (serve's REST API, the
model servers' HTTP APIs): refused unread when its Content-Length is over the cap, else as
soon as what has streamed in passes it, so a body costs at most the cap in memory
(connections' body deadline bounds how long it may take). Each port answers BodyTooLarge
in its own shape, 413 on both: the REST API's `{"error"}`, the model servers' OpenAI, TEI
and Cohere errors (dwsearch.modelserver.http)."""

from __future__ import annotations

from starlette.requests import Request

from dwsearch.common.errors import ResourceExhausted


class BodyTooLarge(ResourceExhausted):
    """A request body over its port's cap: 413 on the HTTP ports (RESOURCE_EXHAUSTED in the
    model servers' request metrics, as their other refusals of a request too large)."""


async def read_capped(request: Request, limit: int) -> bytes:
    """The request's whole body, at most `limit` bytes; BodyTooLarge past that, by its
    Content-Length before a byte is read, else as the chunks come in."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdecimal() and int(declared) > limit:
        raise BodyTooLarge(f"the request body: {int(declared)} bytes; the limit is {limit}")
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body: over the limit of {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)
