"""dwsearch.common.httpbody: the size-capped body both HTTP ports read (the REST API's
413 is in tests/rest/test_rest_dense.py, the model servers' in tests/embedder/test_embedder_http.py)."""

from __future__ import annotations

import grpc
import pytest
from starlette.requests import Request

from dwsearch.common.errors import classify
from dwsearch.common.grpcstatus import GRPC_STATUS
from dwsearch.common.httpbody import BodyTooLarge, read_capped
from dwsearch.common.httpstatus import http_status
from dwsearch.modelserver.http import Dialect, error_body, failure_of


def request(chunks: list[bytes], content_length: int | None = None) -> tuple[Request, list[int]]:
    """A POST whose body arrives in `chunks`; the list counts the chunks read so far."""
    headers = [] if content_length is None else [(b"content-length", str(content_length).encode())]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers, "query_string": b""}
    read = [0]

    async def receive() -> dict:
        i = read[0]
        read[0] += 1
        return {"type": "http.request", "body": chunks[i], "more_body": i + 1 < len(chunks)}

    return Request(scope, receive), read


async def test_a_body_under_the_cap_is_read_whole():
    req, _ = request([b"ab", b"cd", b"e"], content_length=5)
    assert await read_capped(req, 5) == b"abcde"
    req, _ = request([b""])
    assert await read_capped(req, 0) == b""


async def test_a_declared_length_over_the_cap_is_refused_unread():
    req, read = request([b"x" * 11], content_length=11)
    with pytest.raises(BodyTooLarge, match="the request body: 11 bytes; the limit is 10"):
        await read_capped(req, 10)
    assert read == [0]


async def test_a_streamed_body_is_refused_at_the_chunk_that_passes_the_cap():
    req, read = request([b"x" * 6, b"x" * 6, b"x" * 6])  # chunked: no Content-Length
    with pytest.raises(BodyTooLarge, match="the request body: over the limit of 10 bytes"):
        await read_capped(req, 10)
    assert read == [2]


def test_each_model_server_dialect_answers_it_413():
    failure = failure_of(BodyTooLarge("the request body: over the limit of 10 bytes"))
    assert (failure.status, GRPC_STATUS[failure.kind]) == (413, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert error_body(Dialect.OPENAI, failure)["error"] == {
        "message": "the request body: over the limit of 10 bytes",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_too_large",
    }
    assert error_body(Dialect.TEI, failure)["error_type"] == "Validation"
    assert error_body(Dialect.COHERE, failure) == {"message": "the request body: over the limit of 10 bytes"}
    # Unmapped, it would be a full queue's 429: each port maps it to 413 itself.
    assert http_status(classify(BodyTooLarge("x")).kind) == 429
