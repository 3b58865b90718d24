"""Admission control for the model services: refuse work at the door, before it costs.

A request is sized from its text alone (UTF-8 bytes, no tokenizer): every token covers
at least one byte, so bytes plus a few special tokens bound its tokens, and an input the
model will cut can cost no more than the model's limit. Admission refuses, with
RESOURCE_EXHAUSTED, a request whose bytes are over the per-call cap or whose bound would
overflow the queue's token budget; an admitted request holds its share of the budget
(lowered to its real token count once tokenized) until it is answered, cancelled or
expired. So a flood of huge requests is refused in microseconds instead of occupying the
tokenizer and the model for minutes, and a short query behind it still gets in.

Tokenizing runs off the event loop on one thread (fast tokenizers are not thread-safe),
in two lanes like the batcher: a query's tokens are prepared before any bulk chunk still
waiting, and bulk requests are tokenized in chunks, so a query waits for at most one
chunk. Work for a request that was cancelled or whose deadline passed is never started.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from prometheus_client import Counter, Gauge

from dwsearch.common.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable
from dwsearch.modelserver.batching import Lane

T = TypeVar("T")

# Special tokens and prompt prefixes ("query: ", <s>, </s>) a tokenizer adds to any input.
SPECIAL_TOKENS_ALLOWANCE = 16
# Bulk inputs are tokenized in chunks of at most this many characters (or CHUNK_INPUTS
# inputs), so a query never waits behind one large request's tokenizing.
CHUNK_CHARS = 64 * 1024
CHUNK_INPUTS = 32
# With truncation on, an input longer than this many characters per allowed token is cut
# before tokenizing: no tokenizer piece is that long, so the first max-tokens tokens are
# unchanged, and a 250 KB input costs what its first few thousand tokens cost.
PRECUT_CHARS_PER_TOKEN = 32


class RequestTooLarge(ResourceExhausted):
    """A request no wait would let in (over the per-call byte cap, or a bound over the whole
    queue budget): RESOURCE_EXHAUSTED on gRPC, 413 on HTTP (a full queue is 429)."""


class OverLimit(InvalidArgument):
    """A request over a per-request limit (too many inputs, an input over the model's
    limit without truncation): INVALID_ARGUMENT on gRPC, 413 on HTTP."""


_REJECTED = Counter(
    "dwsearch_model_requests_rejected_total",
    "Requests refused before tokenizing, by service and reason (bytes, tokens)",
    ["service", "reason"],
)
_RESERVED = Gauge(
    "dwsearch_model_queue_tokens", "Tokens admitted and not yet answered (upper bound)", ["service"]
)


def utf8_sizes(texts: Sequence[str], limit: int) -> list[int] | None:
    """UTF-8 size of each text, or None when together they are over `limit` bytes (a
    character is at least one byte, so huge inputs are refused without encoding them)."""
    if sum(len(text) for text in texts) > limit:
        return None
    sizes = [len(text.encode("utf-8", "surrogatepass")) for text in texts]
    return None if sum(sizes) > limit else sizes


def precut(text: str, max_tokens: int) -> str:
    limit = max_tokens * PRECUT_CHARS_PER_TOKEN
    return text[:limit] if len(text) > limit else text


class Reservation:
    """A request's share of the token budget; released exactly once."""

    def __init__(self, admission: Admission, tokens: int) -> None:
        self._admission = admission
        self.tokens = tokens

    def settle(self, tokens: int) -> None:
        """Lower the share to the request's real token count."""
        if tokens < self.tokens:
            self._admission._give_back(self.tokens - tokens)
            self.tokens = tokens

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self._admission._give_back(self.tokens)
        self.tokens = 0


class Admission:
    def __init__(self, service: str, *, max_queue_tokens: int, max_request_bytes: int) -> None:
        if min(max_queue_tokens, max_request_bytes) < 1:
            raise ValueError("max_queue_tokens and max_request_bytes must be positive")
        self.service = service
        self.max_queue_tokens = max_queue_tokens
        self.max_request_bytes = max_request_bytes
        self._lock = threading.Lock()
        self._reserved = 0

    @property
    def reserved(self) -> int:
        return self._reserved

    def admit(
        self, texts: Sequence[str], *, max_tokens_each: int | None, extra_tokens: int = 0
    ) -> Reservation:
        """Reserve the bound of `texts`' tokens (each at most `max_tokens_each` when the
        model will cut it) plus `extra_tokens`, or raise ResourceExhausted."""
        sizes = utf8_sizes(texts, self.max_request_bytes)
        if sizes is None:
            _REJECTED.labels(self.service, "bytes").inc()
            raise RequestTooLarge(
                f"request is over the {self.service}'s limit of {self.max_request_bytes} bytes of text per call; "
                "send fewer or shorter inputs per call"
            )
        bound = extra_tokens
        for size in sizes:
            tokens = size + SPECIAL_TOKENS_ALLOWANCE
            bound += min(tokens, max_tokens_each) if max_tokens_each else tokens
        with self._lock:
            if bound > self.max_queue_tokens:
                _REJECTED.labels(self.service, "tokens").inc()
                raise RequestTooLarge(
                    f"request may need up to {bound} tokens, over the {self.service}'s queue budget of "
                    f"{self.max_queue_tokens}; send fewer or shorter inputs per call"
                )
            if self._reserved + bound > self.max_queue_tokens:
                _REJECTED.labels(self.service, "tokens").inc()
                raise ResourceExhausted(
                    f"{self.service} is busy ({self._reserved} of {self.max_queue_tokens} queued tokens taken, "
                    f"this request may need {bound}); retry later"
                )
            self._reserved += bound
            _RESERVED.labels(self.service).set(self._reserved)
        return Reservation(self, bound)

    def _give_back(self, tokens: int) -> None:
        with self._lock:
            self._reserved -= tokens
            _RESERVED.labels(self.service).set(self._reserved)


class LaneExecutor:
    """One worker thread running blocking calls, interactive ones before bulk ones."""

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._lanes: dict[Lane, deque[tuple[concurrent.futures.Future[Any], Callable[[], Any]]]] = {
            Lane.INTERACTIVE: deque(),
            Lane.BULK: deque(),
        }
        self._closing = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[[], T], *, lane: Lane, deadline: float | None = None) -> T:
        """`fn()` on the worker thread. Never started when the caller is cancelled first,
        or when `deadline` (time.monotonic()) has passed by its turn."""

        def call() -> T:
            if deadline is not None and time.monotonic() >= deadline:
                raise DeadlineExceeded("deadline passed before tokenizing")
            return fn()

        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            if self._closing:
                raise Unavailable("shutting down")
            self._lanes[lane].append((future, call))
            self._cond.notify()
        return await asyncio.wrap_future(future)  # cancelling this cancels a future not yet started

    def shutdown(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not any(self._lanes.values()) and not self._closing:
                    self._cond.wait()
                lane = self._lanes[Lane.INTERACTIVE] or self._lanes[Lane.BULK]
                if not lane:
                    return  # closing and drained
                future, call = lane.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:
                future.set_exception(exc)


def chunks(
    texts: Sequence[str], *, max_chars: int = CHUNK_CHARS, max_inputs: int = CHUNK_INPUTS
) -> list[slice]:
    """Consecutive slices of `texts`, each within max_chars (one long text alone) and max_inputs."""
    out: list[slice] = []
    start, size = 0, 0
    for index, text in enumerate(texts):
        length = len(text)
        if index > start and (size + length > max_chars or index - start >= max_inputs):
            out.append(slice(start, index))
            start, size = index, 0
        size += length
    if start < len(texts):
        out.append(slice(start, len(texts)))
    return out
