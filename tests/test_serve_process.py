"""`dwsearch serve` as a real process: schema check, health (on the gRPC port and the
plaintext health port), SIGTERM."""

import os
import signal
import subprocess
import sys
import time

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dwsearch.db.migrate import migrate
from dwsearch_testkit.net import free_port


def serve(url: str, port: int, **env_extra: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "DWSEARCH_DATABASE_URL": url,
        "DWSEARCH_LISTEN_ADDR": f"127.0.0.1:{port}",
        **env_extra,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "dwsearch.cli", "serve", "--log-format", "text"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_serve_refuses_a_database_without_go_tables(empty_db_url):
    migrate(empty_db_url)  # dwsearch's own tables, not the Go module's
    proc = serve(empty_db_url, free_port())
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "dw_chat_events" in err and "org_feature_flags" in err


def test_serve_refuses_a_table_missing_a_column(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE dw_chat_events DROP COLUMN decision")
    proc = serve(db_url, free_port())
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "dw_chat_events.decision" in err


def test_serve_becomes_healthy_and_stops_on_sigterm(db_url):
    port, health_port = free_port(), free_port()
    proc = serve(db_url, port, DWSEARCH_HEALTH_PORT=str(health_port))
    try:
        # The probes' port (DWSEARCH_HEALTH_PORT) reports the same health as the main one.
        with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 60
            status = None
            while time.monotonic() < deadline:
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
            assert status == health_pb2.HealthCheckResponse.SERVING, proc.stderr and proc.poll()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            status = (
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
            )
            assert status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_console_port_in_use_stops_serve_naming_it(db_url):
    """The console starts once the gRPC port is bound (a console that answers has its gRPC
    server accepting); a console port already taken stops serve, naming the port, and
    nothing is left listening."""
    import socket

    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        console_port = taken.getsockname()[1]
        proc = serve(db_url, port, DWSEARCH_CONSOLE_PORT=str(console_port), DWSEARCH_HEALTH_PORT="0")
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode != 0
    assert "the console did not start" in err and str(console_port) in err, err
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # the gRPC port was closed on the way out
