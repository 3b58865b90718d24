"""The REST port's connections over real sockets (dwsearch.common.connections): idle, slowloris
and slow-body clients are closed at their deadlines, connections beyond the cap are closed at
once without the server's side of them ever passing it, and a normal keep-alive client works."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import ssl
from collections.abc import AsyncIterator

import httpx
import pytest
from rest_api import rest_api
from upstash_vector import AsyncIndex

from dwsearch.common import connections
from dwsearch.common.config import ServerConfig, load
from dwsearch.common.connections import raise_fd_limit
from dwsearch.common.errors import StartupError
from dwsearch.index.document_index import IndexParts
from dwsearch.redaction import REDACTION_OFF
from dwsearch.rest.indexfile import parse_indexes
from dwsearch.rest.server import RestServer, rest_server
from dwsearch.rest.server import rest_api as rest_api_of
from dwsearch_testkit.net import free_port

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts sockets through /proc"),
]
INDEX = '[[index]]\nname = "t"\ntoken = "tok"\ndimension = 2\n'
DEADLINE = 0.5
CAP = 8
INFO = b"POST /info HTTP/1.1\r\nhost: x\r\nauthorization: Bearer tok\r\ncontent-length: 0\r\n\r\n"


async def _server(pool, **limits) -> RestServer:
    api = rest_api(pool, parse_indexes(INDEX), redaction=REDACTION_OFF)
    limits = {"max_connections": CAP, "header_timeout": DEADLINE, "body_timeout": DEADLINE} | limits
    server = RestServer(api, "127.0.0.1", 0, **limits)
    await server.start()
    return server


@pytest.fixture
async def gated(pool) -> AsyncIterator[RestServer]:
    server = await _server(pool)
    yield server
    await server.stop()


def server_sockets(port: int) -> int:
    """This process's TCP sockets whose local port is `port`, the listener left out: the
    server's side of its open connections (the clients' sides have ephemeral ports)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] != "0A":  # 0A: LISTEN
                    inodes.add(fields[9])
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith("socket:[") and target[8:-1] in inodes
    return count


async def _until_closed(reader: asyncio.StreamReader, within: float) -> bytes:
    """What the server sent before it closed the connection; fails unless it closes within `within`."""
    data = b""
    try:
        async with asyncio.timeout(within):
            while chunk := await reader.read(65536):
                data += chunk
    except ConnectionError:
        pass
    except TimeoutError:
        pytest.fail(f"the connection was still open after {within} s (sent {data[:60]!r})")
    return data


async def _trickle(writer: asyncio.StreamWriter, data: bytes, size: int, every: float) -> None:
    """Send `data` `size` bytes at a time, one piece every `every` seconds, until the peer goes."""
    try:
        for i in range(0, len(data), size):
            writer.write(data[i : i + size])
            await writer.drain()
            await asyncio.sleep(every)
    except ConnectionError:
        pass


async def test_an_idle_connection_is_closed_at_the_header_deadline(gated):
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await asyncio.open_connection("127.0.0.1", gated.port)
    assert await _until_closed(reader, 3) == b""  # nothing sent: closed without a word
    assert DEADLINE * 0.8 <= loop.time() - started < DEADLINE + 1
    writer.close()


async def test_a_slowloris_head_is_answered_408_at_the_header_deadline(gated):
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await asyncio.open_connection("127.0.0.1", gated.port)
    trickle = asyncio.create_task(_trickle(writer, INFO, 1, 0.2))  # 86 bytes: 17 s
    answer = await _until_closed(reader, 3)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert DEADLINE * 0.8 <= loop.time() - started < DEADLINE + 1
    await trickle
    writer.close()


async def test_a_slow_head_after_a_response_is_closed_too(gated):
    """uvicorn's keep-alive timer stops at the first byte of the next request: the header
    deadline holds for every request of a kept-alive connection, not just the first."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gated.port)
    writer.write(INFO)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
    assert head.startswith(b"HTTP/1.1 200 ")
    (length,) = [
        int(h.split(b":")[1]) for h in head.lower().split(b"\r\n") if h.startswith(b"content-length:")
    ]
    assert json.loads(await reader.readexactly(length))["result"]["vectorCount"] == 0
    loop = asyncio.get_running_loop()
    started = loop.time()
    trickle = asyncio.create_task(_trickle(writer, INFO, 1, 0.2))
    assert (await _until_closed(reader, 3)).startswith(b"HTTP/1.1 408 ")
    assert loop.time() - started < DEADLINE + 1
    await trickle
    writer.close()


async def test_a_slow_body_is_answered_408_at_the_body_deadline(gated, caplog):
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", gated.port)
    writer.write(
        b"POST /upsert HTTP/1.1\r\nhost: x\r\nauthorization: Bearer tok\r\ncontent-type: application/json\r\n"
        b"content-length: 1000\r\n\r\n"
    )
    started = loop.time()
    trickle = asyncio.create_task(_trickle(writer, b" " * 1000, 5, 0.2))  # 40 s
    answer = await _until_closed(reader, 3)
    assert answer.startswith(b"HTTP/1.1 408 ") and answer.count(b"HTTP/1.1") == 1
    assert DEADLINE * 0.8 <= loop.time() - started < DEADLINE + 1
    await trickle
    writer.close()
    await asyncio.sleep(0.2)  # the handler sees the disconnect
    assert not [
        r for r in caplog.records if r.levelname == "ERROR"
    ]  # a client gone mid-body is no server fault


async def test_a_slow_chunked_body_is_closed_at_the_body_deadline(gated):
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", gated.port)
    writer.write(
        b"POST /upsert HTTP/1.1\r\nhost: x\r\nauthorization: Bearer tok\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    started = loop.time()
    trickle = asyncio.create_task(_trickle(writer, b"1\r\n \r\n" * 200, 6, 0.2))
    assert (await _until_closed(reader, 3)).startswith(b"HTTP/1.1 408 ")
    assert loop.time() - started < DEADLINE + 1
    await trickle
    writer.close()


async def test_beyond_the_cap_connections_are_closed_at_once(pool):
    # The idle connections' deadline outlasts the flood below (1.3 s on a 2-core AMD EPYC,
    # the sampler reading /proc/net/tcp between the flood's steps).
    server = await _server(pool, header_timeout=4)
    loop = asyncio.get_running_loop()
    try:
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(CAP)]
        await asyncio.sleep(0.05)
        assert server_sockets(server.port) == CAP
        for _ in range(20):  # one at a time: each is answered and closed before the next
            started = loop.time()
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            assert (await _until_closed(reader, 1)).startswith(b"HTTP/1.1 503 ")
            assert loop.time() - started < 0.5
            assert server_sockets(server.port) <= CAP + 1
            writer.close()
        # A flood: the server's side never holds more than the cap and one accept burst,
        # and is back at the cap once the refused ones are closed.
        peak = 0

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, server_sockets(server.port))
                await asyncio.sleep(0)

        sampler = asyncio.create_task(sample())
        flood = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", server.port) for _ in range(200)))
        answers = await asyncio.gather(*(_until_closed(reader, 4) for reader, _ in flood))
        sampler.cancel()
        assert all(a == b"" or a.startswith(b"HTTP/1.1 503 ") for a in answers)
        assert peak <= CAP + connections.ACCEPT_BURST + 8
        assert server_sockets(server.port) == CAP
        for _, writer in flood:
            writer.close()
        # The idle ones go at the header deadline; then a request on a new connection works.
        for reader, _ in idle:
            assert await _until_closed(reader, 5) == b""
        async with httpx.AsyncClient() as client:
            response = await client.post(
                f"http://127.0.0.1:{server.port}/info", headers={"Authorization": "Bearer tok"}
            )
        assert response.status_code == 200
        for _, writer in idle:
            writer.close()
    finally:
        await server.stop()


async def test_a_keep_alive_client_makes_several_requests(gated):
    url = f"http://127.0.0.1:{gated.port}"
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer tok"}) as client:
        ports = set()
        for i in range(5):
            response = await client.post("/upsert", json=[{"id": str(i), "vector": [1.0, float(i)]}])
            assert response.status_code == 200, response.text
            ports.add(response.extensions["network_stream"].get_extra_info("client_addr")[1])
            await asyncio.sleep(DEADLINE / 4)
        assert len(ports) == 1  # one connection, kept alive across the requests
    index = AsyncIndex(url=url, token="tok", retries=0)
    await index.upsert(vectors=[("a", [1.0, 0.0]), ("b", [0.0, 1.0])])
    assert (await index.info()).vector_count == 7
    assert [r.id for r in await index.query(vector=[0.0, 1.0], top_k=1)] == ["b"]
    assert {r.id for r in await index.fetch(["a", "b"])} == {"a", "b"}


async def test_a_tls_handshake_has_the_header_deadline_and_the_cap(pool, tmp_path):
    from rel_pki import make_pki, openssl_missing

    if openssl_missing():
        pytest.skip("no openssl")
    pki = make_pki(tmp_path / "pki")
    api = rest_api(pool, parse_indexes(INDEX), redaction=REDACTION_OFF)
    server = RestServer(
        api, "127.0.0.1", 0, tls_cert=pki.path("server.pem"), tls_key=pki.path("server.key"),
        max_connections=2, header_timeout=DEADLINE,
    )  # fmt: skip
    await server.start()
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        silent = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]  # no ClientHello
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await _until_closed(reader, 1) == b""  # beyond the cap: closed at once
        assert loop.time() - started < DEADLINE
        writer.close()
        for reader, writer in silent:
            assert await _until_closed(reader, 3) == b""
            writer.close()
        assert loop.time() - started < DEADLINE + 1
        context = ssl.create_default_context(cafile=pki.path("ca.pem"))
        async with httpx.AsyncClient(verify=context) as client:
            response = await client.post(
                f"https://127.0.0.1:{server.port}/info", headers={"Authorization": "Bearer tok"}
            )
        assert response.status_code == 200
    finally:
        await server.stop()


async def test_request_bytes_that_come_with_the_tls_handshake_are_served(pool, tmp_path):
    """The gate starts TLS itself: the client's Finished and its request in one segment reach
    the protocol before start_tls returns, and are served, not lost."""
    from rel_pki import make_pki, openssl_missing

    if openssl_missing():
        pytest.skip("no openssl")
    pki = make_pki(tmp_path / "pki")
    api = rest_api(pool, parse_indexes(INDEX), redaction=REDACTION_OFF)
    server = RestServer(api, "127.0.0.1", 0, tls_cert=pki.path("server.pem"), tls_key=pki.path("server.key"))
    await server.start()

    def client() -> bytes:
        tls = ssl.create_default_context(cafile=pki.path("ca.pem"))
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        connection = tls.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            while True:
                try:
                    connection.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    sock.sendall(outgoing.read())
                    incoming.write(sock.recv(65536))
            connection.write(INFO)
            sock.sendall(outgoing.read())  # the handshake's Finished and the request together
            answer = b""
            while b"vectorCount" not in answer:
                incoming.write(sock.recv(65536))
                with contextlib.suppress(ssl.SSLWantReadError):
                    while chunk := connection.read(65536):  # each record the segment holds
                        answer += chunk
            return answer

    try:
        assert (await asyncio.to_thread(client)).startswith(b"HTTP/1.1 200 ")
    finally:
        await server.stop()


def test_the_cap_must_leave_file_descriptors_for_the_rest(monkeypatch):
    import resource

    raised = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: raised.append(limits))
    assert raise_fd_limit(512) == 4096 and raised == [(4096, 4096)]
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024))
    assert raise_fd_limit(1024 - connections.FD_HEADROOM) == 1024
    with pytest.raises(StartupError, match=r"DWSEARCH_REST_MAX_CONNECTIONS \(1000\).*at most 512"):
        raise_fd_limit(1000)


def test_the_settings_reach_the_server(pool, tmp_path):
    indexes = tmp_path / "indexes.toml"
    indexes.write_text(INDEX)
    environ = {
        "DWSEARCH_REST_PORT": "8080",
        "DWSEARCH_REST_INDEXES": str(indexes),
        "DWSEARCH_REST_MAX_CONNECTIONS": "64",
        "DWSEARCH_REST_HEADER_TIMEOUT_SECONDS": "2.5",
        "DWSEARCH_REST_BODY_TIMEOUT_SECONDS": "7",
    }
    config = load(ServerConfig, environ=environ)
    api = rest_api_of(config, IndexParts(pool))
    assert api is not None and set(api.indexes) == {"t"}
    limits = rest_server(config, api).limits
    assert rest_api_of(load(ServerConfig, environ={}), IndexParts(pool)) is None  # no REST port: no REST API
    assert (limits.max_connections, limits.header_timeout, limits.body_timeout) == (64, 2.5, 7)
    defaults = load(ServerConfig, environ={})
    assert (defaults.rest_max_connections, defaults.rest_header_timeout_seconds) == (512, 10.0)
    assert defaults.rest_body_timeout_seconds == 30.0
    with pytest.raises(SystemExit, match="DWSEARCH_REST_MAX_CONNECTIONS"):
        load(ServerConfig, environ={"DWSEARCH_REST_MAX_CONNECTIONS": "0"})


async def test_serve_builds_the_rest_api_and_the_console_over_its_own_parts(pool, tmp_path):
    """The composition root builds the REST API's indexes from the parts the Index has (one
    pool, read pool, embedder, redaction and query cache), and the console; transports then
    only serve what it built."""
    from dwsearch.clients.embedder import EmbedderClient
    from dwsearch.serve import build_application, transports

    indexes = tmp_path / "indexes.toml"
    indexes.write_text(INDEX)
    config = ServerConfig(
        rest_port=free_port(),
        rest_indexes=str(indexes),
        console_port=free_port(),
        listen_addr="127.0.0.1:50999",
    )
    embedder = EmbedderClient("127.0.0.1:1", timeout=1)
    app = build_application(config=config, pool=pool, embedder=embedder, reranker=None)
    try:
        assert app.rest is not None and app.console is not None
        (rest_index,) = app.rest.indexes.values()
        for domain in (rest_index.domain, app.documents):
            assert domain.pool is app.pool and domain.read_pool is app.read_pool
            assert domain.redaction is app.redaction
        assert app.console.pool is app.pool and app.console.embedder is app.embedder
        # One query embedder per model, for chat search and every index that embeds: the
        # same deadline (DWSEARCH_EMBED_TIMEOUT_MS), breaker, Info and cache.
        queries = app.searcher.legs.active[0].queries
        assert app.documents.queries is queries
        assert queries.timeout == config.embed_timeout_ms / 1000 and queries.breaker is not None
        host, rest, console = transports(app, None)
        assert rest is not None and rest.api is app.rest
        assert console is not None and console.console is app.console
        assert host is not None
    finally:
        await embedder.close()

    bare = build_application(
        config=ServerConfig(), pool=pool, embedder=EmbedderClient("127.0.0.1:1"), reranker=None
    )
    try:
        assert bare.rest is None and bare.console is None
        _, rest, console = transports(bare, None)
        assert rest is None and console is None
    finally:
        await bare.embedder.close()


async def test_a_rest_port_without_an_index_file_stops_serve_naming_the_setting(pool):
    from dwsearch.clients.embedder import EmbedderClient
    from dwsearch.serve import build_application

    embedder = EmbedderClient("127.0.0.1:1", timeout=1)
    try:
        with pytest.raises(StartupError, match="DWSEARCH_REST_INDEXES must name the indexes' TOML file"):
            build_application(
                config=ServerConfig(rest_port=8080), pool=pool, embedder=embedder, reranker=None
            )
    finally:
        await embedder.close()
