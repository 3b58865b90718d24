"""The interceptor's admission, over real sockets: scoped tokens, checked before a
request's message is read; a size limit per method, checked before it is parsed; a cap on
calls in flight that health probes are not counted against; reflection only when asked."""

from __future__ import annotations

import asyncio
import hmac

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from polling import until

from dwsearch.common.grpchost import GrpcHost, Service, is_loopback
from dwsearch.common.rpcpolicy import MethodPolicy, Scope, Tokens, parse_tokens

PROBE = "dwsearch.test.Probe"
SEARCH_TOKENS = "s-old,s-new"
INDEX_TOKENS = "i-1"
ADMIN_TOKENS = "a-1"
LIMIT = 64 * 1024


class Probe:
    """A service whose methods count the messages they parse and can be held open."""

    def __init__(self) -> None:
        self.parsed = 0
        self.release = asyncio.Event()
        self.release.set()
        self.entered = 0
        self._entering = asyncio.Condition()

    def parse(self, raw: bytes) -> bytes:
        self.parsed += 1
        return raw

    async def _enter(self) -> None:
        async with self._entering:
            self.entered += 1
            self._entering.notify_all()

    async def until_entered(self, calls: int) -> None:
        """Until `calls` calls in all have reached a method (their message read)."""
        async with asyncio.timeout(10), self._entering:
            await self._entering.wait_for(lambda: self.entered >= calls)

    async def call(self, request: bytes, context) -> bytes:
        await self._enter()
        await self.release.wait()
        return b"ok:%d" % len(request)

    async def stream(self, request: bytes, context):
        await self._enter()
        await self.release.wait()
        yield b"one"
        yield b"two"

    def register(self, server: grpc.aio.Server) -> None:
        handlers = {
            "Search": grpc.unary_unary_rpc_method_handler(self.call, self.parse, lambda b: b),
            "Write": grpc.unary_unary_rpc_method_handler(self.call, self.parse, lambda b: b),
            "Admin": grpc.unary_stream_rpc_method_handler(self.stream, self.parse, lambda b: b),
            "Unlisted": grpc.unary_unary_rpc_method_handler(self.call, self.parse, lambda b: b),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(PROBE, handlers),))


POLICIES = {
    f"/{PROBE}/Search": MethodPolicy(Scope.SEARCH, LIMIT),
    f"/{PROBE}/Write": MethodPolicy(Scope.INDEX, 8 * 2**20),
    f"/{PROBE}/Admin": MethodPolicy(Scope.ADMIN, LIMIT),
}


async def start(probe: Probe, **kwargs) -> GrpcHost:
    kwargs.setdefault(
        "tokens", Tokens.from_settings(search=SEARCH_TOKENS, index=INDEX_TOKENS, admin=ADMIN_TOKENS)
    )
    host = GrpcHost("127.0.0.1:0", [Service(PROBE, probe.register)], policies=POLICIES, **kwargs)
    await host.start()
    await host.set_serving(True)
    return host


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def call(channel: grpc.aio.Channel, method: str, payload: bytes, token: str | None) -> grpc.StatusCode:
    metadata = bearer(token) if token else ()
    try:
        if method == "Admin":
            stub = channel.unary_stream(
                f"/{PROBE}/{method}", request_serializer=None, response_deserializer=None
            )
            assert [r async for r in stub(payload, metadata=metadata, timeout=30)] == [b"one", b"two"]
        else:
            stub = channel.unary_unary(
                f"/{PROBE}/{method}", request_serializer=None, response_deserializer=None
            )
            assert await stub(payload, metadata=metadata, timeout=30) == b"ok:%d" % len(payload)
    except grpc.aio.AioRpcError as exc:
        assert exc.details(), exc
        return exc.code()
    return grpc.StatusCode.OK


OK = grpc.StatusCode.OK
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
TOO_BIG = grpc.StatusCode.RESOURCE_EXHAUSTED


def test_tokens_grant_their_scope_and_the_ones_below_it():
    tokens = Tokens.from_settings(all_scopes="all", search=" s1 , s2,,", index="i1", admin="a1,s2")
    assert parse_tokens(" s1 , s2,,") == ("s1", "s2")
    assert tokens.scope_of(b"Bearer s1") is Scope.SEARCH
    assert tokens.scope_of(b"Bearer s2") is Scope.ADMIN  # listed twice: the wider scope
    assert tokens.scope_of(b"Bearer i1") is Scope.INDEX
    assert tokens.scope_of(b"Bearer a1") is Scope.ADMIN
    assert tokens.scope_of(b"Bearer all") is Scope.ADMIN  # DWSEARCH_AUTH_TOKEN: every scope
    for wrong in (None, b"", b"s1", b"Bearer s", b"Bearer s1 ", b"bearer s1", b"Bearer "):
        assert tokens.scope_of(wrong) is None
    assert Scope.SEARCH < Scope.INDEX < Scope.ADMIN
    assert not Tokens.from_settings() and not Tokens.single("")
    assert len(Tokens.single("x")) == 1


def test_every_token_is_compared_in_constant_time(monkeypatch):
    compared = []
    real = hmac.compare_digest

    def compare(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr("dwsearch.common.rpcpolicy.hmac.compare_digest", compare)
    tokens = Tokens.from_settings(search="s1,s2", index="i1", admin="a1")
    assert tokens.scope_of(b"Bearer s1") is Scope.SEARCH
    assert len(compared) == 4  # no early exit on the first match


async def test_scopes_and_rotation():
    probe = Probe()
    host = await start(probe)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            expected = {
                # token: (Search, Write, Admin, a method without a policy: admin only)
                None: (UNAUTH, UNAUTH, UNAUTH, UNAUTH),
                "wrong": (UNAUTH, UNAUTH, UNAUTH, UNAUTH),
                "s-old": (OK, DENIED, DENIED, DENIED),
                "s-new": (OK, DENIED, DENIED, DENIED),  # two search tokens at once: rotation
                "i-1": (OK, OK, DENIED, DENIED),
                "a-1": (OK, OK, OK, OK),
            }
            for token, codes in expected.items():
                got = tuple(
                    [await call(channel, m, b"x", token) for m in ("Search", "Write", "Admin", "Unlisted")]
                )
                assert got == codes, token
            # Health needs no token.
            response = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            assert response.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await host.stop(0)
    # Only the calls let in had their message parsed: s-old 1, s-new 1, i-1 2, a-1 4.
    assert probe.parsed == 8


async def test_a_refused_call_is_answered_without_reading_its_message():
    """A refusal is decided from the metadata alone: an 8 MiB message without a token, or
    with a token of too narrow a scope, is answered at once and never read or parsed; a
    message over its method's limit is read but never parsed."""
    probe = Probe()
    host = await start(probe)
    big = b"x" * (8 * 2**20 - 1024)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            assert await call(channel, "Write", big, None) == UNAUTH
            assert await call(channel, "Write", big, "s-new") == DENIED
            assert probe.parsed == 0 and probe.entered == 0
            assert await call(channel, "Search", b"x" * (LIMIT + 1), "s-new") == TOO_BIG
            assert probe.parsed == 0 and probe.entered == 0
            assert await call(channel, "Search", b"x" * LIMIT, "s-new") == OK
            assert await call(channel, "Write", big, "i-1") == OK
            assert probe.parsed == 2
            stub = channel.unary_unary(
                f"/{PROBE}/Search", request_serializer=None, response_deserializer=None
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub(b"x" * (LIMIT + 1), metadata=bearer("s-new"), timeout=30)
            assert f"at most {LIMIT}" in info.value.details()
            assert "65537 bytes" in info.value.details()
    finally:
        await host.stop(0)


async def test_calls_in_flight_are_capped_and_health_is_not_counted():
    probe = Probe()
    host = await start(probe, max_concurrent_rpcs=2)
    probe.release.clear()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            held = [asyncio.ensure_future(call(channel, m, b"x", "a-1")) for m in ("Search", "Admin")]
            await probe.until_entered(2)
            assert host.interceptor.in_flight == 2
            # A third call of any method is refused before its message is read.
            assert await call(channel, "Write", b"x" * 2**20, "a-1") == TOO_BIG
            assert probe.parsed == 2
            stub = channel.unary_unary(
                f"/{PROBE}/Search", request_serializer=None, response_deserializer=None
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub(b"x", metadata=bearer("a-1"), timeout=30)
            assert "DWSEARCH_MAX_CONCURRENT_RPCS=2" in info.value.details()
            # Kubernetes' probes still get in.
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(5):
                response = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert response.status == health_pb2.HealthCheckResponse.SERVING
            # A cancelled call gives its slot back, as a finished one does.
            cancelled = channel.unary_unary(
                f"/{PROBE}/Write", request_serializer=None, response_deserializer=None
            )
            probe.release.set()
            assert await asyncio.gather(*held) == [OK, OK]
            probe.release.clear()
            pending = cancelled(b"x", metadata=bearer("a-1"), timeout=30)
            await probe.until_entered(3)
            pending.cancel()
            await until(lambda: host.interceptor.in_flight == 0, what="the cancelled call's slot back")
            probe.release.set()
            assert [await call(channel, "Search", b"x", "a-1") for _ in range(3)] == [OK, OK, OK]
    finally:
        await host.stop(0)


async def test_reflection_is_off_unless_asked():
    for enabled in (False, True):
        host = await start(Probe(), reflection=enabled)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
                stub = reflection_pb2_grpc.ServerReflectionStub(channel)

                async def requests():
                    yield reflection_pb2.ServerReflectionRequest(list_services="")

                try:
                    async for response in stub.ServerReflectionInfo(requests(), timeout=5):
                        names = {s.name for s in response.list_services_response.service}
                        break
                except grpc.aio.AioRpcError as exc:
                    assert not enabled and exc.code() == grpc.StatusCode.UNIMPLEMENTED
                else:
                    assert enabled and PROBE in names
        finally:
            await host.stop(0)


def test_loopback_addresses():
    for address in ("127.0.0.1:50051", "localhost:50051", "[::1]:50051", "unix:/run/dwsearch.sock"):
        assert is_loopback(address), address
    for address in ("[::]:50051", "0.0.0.0:50051", "10.1.2.3:50051", "dwsearch:50051"):
        assert not is_loopback(address), address
