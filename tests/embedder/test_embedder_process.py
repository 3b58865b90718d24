"""`dwsearch embedder` as a real process: start-up errors, health, SIGTERM draining a call
in flight, and several models (DWSEARCH_EMBED_MODELS)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import grpc
import numpy as np
import openai
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dwsearch.v1 import embedder_pb2 as pb
from dwsearch.v1 import embedder_pb2_grpc as pb_grpc
from dwsearch_testkit.net import free_port
from dwsearch_testkit.tiny_models import minilm_dir

E5_ID = "intfloat/multilingual-e5-small"


def embedder(port: int, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dwsearch.cli",
            "embedder",
            "--listen-addr",
            f"127.0.0.1:{port}",
            "--log-format",
            "text",
            *args,
        ],
        env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_serving(channel: grpc.Channel, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Poll health until SERVING (the process loads its model first)."""
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (
                health.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                == health_pb2.HealthCheckResponse.SERVING
            ):
                return
        except grpc.RpcError:
            pass
        time.sleep(0.1)  # polling a process's start-up, with a deadline
    raise AssertionError(f"embedder never became SERVING: {proc.poll()}")


def test_a_missing_model_is_a_clear_start_up_error(tmp_path):
    proc = embedder(free_port(), "--embed-model", "BAAI/bge-m3", HF_HUB_CACHE=str(tmp_path))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "BAAI/bge-m3 is not in the Hugging Face cache" in err and "HF_HUB_OFFLINE" in err
    assert "Traceback" not in err


def queued_tokens(metrics_port: int) -> float:
    """The embedder's admitted, unanswered tokens, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith('dwsearch_model_queue_tokens{service="embedder"}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_sigterm_lets_the_call_in_flight_finish():
    port, metrics_port = free_port(), free_port()
    proc = embedder(
        port,
        "--embed-model",
        "intfloat/multilingual-e5-small",
        "--grace-seconds",
        "30",
        "--metrics-port",
        str(metrics_port),
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)
            # Long enough to still be running when the signal lands (seconds on two cores).
            texts = [" ".join(f"kata{i} word{j}" for j in range(15)) for i in range(64)]
            call = pb_grpc.EmbedderServiceStub(channel).Embed.future(
                pb.EmbedRequest(inputs=texts, truncate=True), timeout=120
            )
            deadline = time.monotonic() + 30
            while queued_tokens(metrics_port) == 0:  # the call is admitted: in the engine now
                assert time.monotonic() < deadline and not call.done(), "the call never reached the engine"
                time.sleep(0.01)  # polling another process, with a deadline
            assert not call.done()
            proc.send_signal(signal.SIGTERM)
            response = call.result()
        assert len(response.embeddings) == 64
        proc.wait(timeout=60)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_message_over_the_request_cap_is_refused_by_grpc_before_it_is_parsed():
    port = free_port()
    proc = embedder(port, "--embed-model", "intfloat/multilingual-e5-small", "--max-request-bytes", "100000")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)
            stub = pb_grpc.EmbedderServiceStub(channel)
            try:
                stub.Embed(pb.EmbedRequest(inputs=["x" * 200_000] * 2), timeout=30)
                raise AssertionError("a 400 kB message was accepted under a 100 kB cap")
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            try:  # under the message limit, over the text cap: the engine's own check
                stub.Embed(pb.EmbedRequest(inputs=["x" * 60_000] * 2), timeout=30)
                raise AssertionError("120 kB of text was accepted under a 100 kB cap")
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "bytes of text per call" in error.details()
            assert len(stub.Embed(pb.EmbedRequest(inputs=["refund"]), timeout=30).embeddings) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_process_serves_two_models_and_reports_them():
    port = free_port()
    proc = embedder(port, DWSEARCH_EMBED_MODELS=f"{E5_ID},{minilm_dir()}")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)  # SERVING only once both are warm
            stub = pb_grpc.EmbedderServiceStub(channel)
            info = stub.Info(pb.EmbedderServiceInfoRequest(), timeout=10)
            assert list(info.served_models) == [E5_ID, "model"]  # MiniLM's directory is named model
            response = stub.Embed(pb.EmbedRequest(inputs=["refund"], model="model"), timeout=30)
            assert response.model_id == "model"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_one_models_failure_at_load_fails_start_up_with_one_line(tmp_path):
    missing = tmp_path / "no-such-model"
    proc = embedder(free_port(), DWSEARCH_EMBED_MODELS=f"{E5_ID},{missing}")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    last = err.strip().splitlines()[-1]
    assert last == f"embedder: model {missing}: model directory {missing} does not exist"
    assert "Traceback" not in err


def test_the_http_port_serves_the_openai_api_beside_grpc_and_drains_on_sigterm():
    port, http_port = free_port(), free_port()
    proc = embedder(port, "--embed-model", E5_ID, "--http-port", str(http_port), DWSEARCH_AUTH_TOKEN="tok")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)
            expected = pb_grpc.EmbedderServiceStub(channel).Embed(
                pb.EmbedRequest(inputs=["apa khabar", "hello"], priority=pb.PRIORITY_INTERACTIVE),
                metadata=(("authorization", "Bearer tok"),),
                timeout=30,
            )
        client = openai.OpenAI(api_key="tok", base_url=f"http://127.0.0.1:{http_port}/v1", max_retries=0)
        answer = client.embeddings.create(model=E5_ID, input=["apa khabar", "hello"])
        np.testing.assert_array_equal(
            np.array([d.embedding for d in answer.data], dtype=np.float32),
            np.array([list(e.dense) for e in expected.embeddings], dtype=np.float32),
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=5) as response:
            assert response.status == 200
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
