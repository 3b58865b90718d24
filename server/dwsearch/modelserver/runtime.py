"""The model-server runtime shared by `dwsearch embedder` and `dwsearch reranker`: the
engine's lifecycle (load the model off the event loop, make its batcher, warm up, report
ready, drain on stop), admission and tokenizing in lanes, and the process around one or
more engines (threads, gRPC host, health, metrics, start-up errors). Each service adds
only what is its own: the backend, the request methods, the inference run and the warm-up.

A request is admitted by a cheap size bound (dwsearch.modelserver.admission), tokenized on the
engine's one tokenizer thread and run on its batcher's inference thread, each stage in two
lanes, interactive before bulk (dwsearch.modelserver.batching).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeAlias, TypeVar

import grpc
from prometheus_client import Gauge
from starlette.applications import Starlette

from dwsearch.common.config import EmbedderConfig, ModelServiceConfig, RerankerConfig
from dwsearch.common.errors import Internal, StartupError, Unavailable
from dwsearch.common.grpchost import GrpcHost, Service, run_until_signalled
from dwsearch.common.metrics import serve_metrics
from dwsearch.common.tls import server_tls
from dwsearch.modelserver.admission import Admission, LaneExecutor, chunks
from dwsearch.modelserver.batching import Batcher, Lane, prior_overhead_tokens
from dwsearch.modelserver.http import HttpHost, HttpState, http_host_of
from dwsearch.modelserver.quantcheck import RuntimeReport
from dwsearch.modelserver.threads import apply_thread_env, resolve_threads

log = logging.getLogger(__name__)

# A servicer method's context (grpc-stubs makes it generic; the runtime class is not).
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

# A request message is its texts plus a few bytes of framing per input and field.
RECEIVE_SLACK_BYTES = 256 * 1024


@dataclass(frozen=True)
class ModelLimits:
    """The batcher's and admission's limits, shared by both services' engines."""

    max_batch_tokens: int = 16384
    max_batch_inputs: int = 256
    max_queue: int = 1024
    max_queue_tokens: int = 262_144
    max_request_bytes: int = 8 * 1024 * 1024
    bulk_batch_ms: float = 0.0  # 0 = the engine's default (see each service)


L = TypeVar("L", bound=ModelLimits)


def limits_from(cfg: ModelServiceConfig, cls: type[L], **own: Any) -> L:
    """`cls` (a service's limits) with the shared fields from the configuration, plus `own`."""
    return cls(
        max_batch_tokens=cfg.max_batch_tokens,
        max_batch_inputs=cfg.max_batch_inputs,
        max_queue=cfg.max_queue,
        max_queue_tokens=cfg.max_queue_tokens,
        max_request_bytes=cfg.max_request_bytes,
        bulk_batch_ms=cfg.bulk_batch_ms,
        **own,
    )


class LoadedInfo(Protocol):
    """What every backend's description says about the loaded model."""

    @property
    def model_id(self) -> str: ...
    @property
    def revision(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def runtime(self) -> str: ...
    @property
    def runtime_report(self) -> RuntimeReport: ...


# One series per served model: what it computes with (an alert can watch the CPU class
# and the quantization of every pod), and whether its int8 export was refused.
_RUNTIME = Gauge(
    "dwsearch_model_runtime_info",
    "1 for the runtime a model is served with: CPU class, quantization, whether its int8 check passed",
    ["service", "model", "runtime", "cpu_class", "quantization", "int8_check"],
)
_INT8_REFUSED = Gauge(
    "dwsearch_model_int8_refused",
    "1 when a model's int8 export was refused (failed its check against float32, or saturates this CPU) "
    "and the model runs float32 instead",
    ["service", "model"],
)

InfoT = TypeVar("InfoT", bound=LoadedInfo)
JobT = TypeVar("JobT")
OutT = TypeVar("OutT")
T = TypeVar("T")


@dataclass(frozen=True)
class Shared:
    """What the engines of one process share when it serves several models: one admission
    budget (queued tokens and request bytes bound the process's memory, whichever model
    the work is for) and one bulk lock (one bulk batch at a time over the shared cores)."""

    admission: Admission
    bulk_lock: threading.Lock


def shared_by_models(service: str, limits: ModelLimits) -> Shared:
    return Shared(
        Admission(
            service, max_queue_tokens=limits.max_queue_tokens, max_request_bytes=limits.max_request_bytes
        ),
        threading.Lock(),
    )


class ModelEngine(ABC, Generic[InfoT, JobT, OutT]):
    """One loaded model behind admission, a tokenizer thread and a batcher.

    Lifecycle: `start` loads the model (blocking, off the event loop), checks it
    (`_check_loaded`), makes the batcher for its device, runs the service's warm-up through
    the same path as a request, and logs "model ready"; the process reports SERVING only
    after every engine started. `stop` finishes queued work."""

    service: ClassVar[str]  # "embedder" | "reranker": names metrics, threads and messages

    def __init__(
        self,
        limits: ModelLimits,
        *,
        per_request: tuple[str, int],
        name: str = "",
        shared: Shared | None = None,
    ) -> None:
        """`per_request`: the setting that caps one request's inputs, and its value (it
        must fit the queue). `name`: the model as configured (a hub id or a directory),
        which requests may use besides the model id. `shared`: see Shared; None = own."""
        setting, most = per_request
        if most > limits.max_queue:
            raise StartupError(f"{setting} ({most}) exceeds max_queue ({limits.max_queue})")
        self.limits = limits
        self.name = name
        self._info: InfoT | None = None
        self._admission = (
            shared.admission
            if shared is not None
            else Admission(
                self.service,
                max_queue_tokens=limits.max_queue_tokens,
                max_request_bytes=limits.max_request_bytes,
            )
        )
        self._bulk_lock = shared.bulk_lock if shared is not None else None
        # Fast tokenizers are not thread-safe: one thread owns the tokenizer.
        self._tokenizer = LaneExecutor(f"{self.service}-tokenizer")
        self._batcher: Batcher[JobT, OutT] | None = None  # made once the device is known

    # --- what each service provides ---------------------------------------------------

    @abstractmethod
    def _load(self) -> InfoT:
        """Load the model (blocking; runs off the event loop) and describe it."""

    def _check_loaded(self, info: InfoT) -> None:
        """Refuse a loaded model the settings do not fit (StartupError)."""

    @abstractmethod
    def _run(self, jobs: Sequence[JobT]) -> list[OutT | Exception]:
        """The inference thread's work: one batch through the model."""

    @abstractmethod
    async def _warm_up(self) -> dict[str, Any]:
        """Run the model once through the request path; what to add to "model ready"."""

    # --- the lifecycle ----------------------------------------------------------------

    @property
    def info(self) -> InfoT:
        if self._info is None:
            raise Unavailable(f"the {self.service} is still loading its model")
        return self._info

    @property
    def loaded(self) -> bool:
        return self._info is not None

    async def start(self) -> None:
        info = await asyncio.to_thread(self._load)
        self._check_loaded(info)
        self._batcher = Batcher(
            self.service,
            self._run,
            max_batch_tokens=self.limits.max_batch_tokens,
            max_batch_inputs=self.limits.max_batch_inputs,
            max_queue=self.limits.max_queue,
            prior_overhead_tokens=prior_overhead_tokens(info.device),
            bulk_batch_seconds=self.limits.bulk_batch_ms / 1000,
            # On a CPU a query runs beside the bulk batch in flight, sharing the cores,
            # instead of waiting for it: one long bulk input (a chat window on a full-size
            # model) takes several query times. A GPU runs one batch at a time anyway.
            interactive_worker=info.device == "cpu",
            model=info.model_id,
            bulk_lock=self._bulk_lock,
        )
        self._batcher.start()
        self._info = info
        report = info.runtime_report
        check = report.check
        _RUNTIME.labels(
            self.service, info.model_id, info.runtime, report.cpu_class, report.quantization,
            "none" if check is None else "passed" if check.passed else "failed",
        ).set(1)  # fmt: skip
        _INT8_REFUSED.labels(self.service, info.model_id).set(1 if report.note else 0)
        ready = await self._warm_up()
        log.info(
            "model ready",
            extra={
                "model_id": info.model_id,
                "revision": info.revision,
                "device": info.device,
                "dtype": info.dtype,
                "runtime": info.runtime,
                **report.log_fields(),
                **ready,
            },
        )

    async def stop(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()
        self._tokenizer.shutdown()

    # --- the request path ---------------------------------------------------------------

    @property
    def batcher(self) -> Batcher[JobT, OutT]:
        assert self._batcher is not None  # made before the model is reported loaded
        return self._batcher

    async def _tokenize(
        self,
        texts: Sequence[str],
        prepare: Callable[[Sequence[str]], list[T]],
        *,
        lane: Lane,
        deadline: float | None,
    ) -> list[T]:
        """`prepare` over `texts` on the tokenizer thread, chunk by chunk (a query waits
        for at most one bulk chunk), results in order."""
        out: list[T] = []
        for part in chunks(texts):
            out += await self._tokenizer.run(
                functools.partial(prepare, texts[part]), lane=lane, deadline=deadline
            )
        return out

    def info_fields(self) -> dict[str, Any]:
        """The Info response fields both services have (the queues: inputs waiting now,
        per lane)."""
        info = self.info
        interactive, bulk = self._batcher.queued_by_lane() if self._batcher is not None else (0, 0)
        return {
            "model_id": info.model_id,
            "revision": info.revision,
            "device": info.device,
            "dtype": info.dtype,
            "runtime": info.runtime,
            "max_batch_tokens": self.limits.max_batch_tokens,
            "runtime_report": info.runtime_report.to_pb(),
            "queued_interactive": interactive,
            "queued_bulk": bulk,
        }

    def _non_finite(self, what: str, tokens: int) -> Internal:
        # The text is never logged: it may hold personal data.
        log.error(
            f"model produced a non-finite {what}", extra={"model_id": self.info.model_id, "tokens": tokens}
        )
        return Internal(f"the model produced a non-finite {what}")


E = TypeVar("E", bound=ModelEngine[Any, Any, Any])
S = TypeVar("S")


def grpc_service(name: str, add: Callable[[S, grpc.aio.Server], None], servicer: S) -> Service:
    """The servicer as the host registers it (`add`: the generated add_*Servicer_to_server)."""
    return Service(name, lambda server: add(servicer, server))


async def start_all(engines: Sequence[ModelEngine[Any, Any, Any]]) -> None:
    """Start the engines one after another (a model's warm-up measures its latency on
    cores no other model is loading on). A start-up error names the model when there are
    several."""
    for engine in engines:
        try:
            await engine.start()
        except StartupError as exc:
            if len(engines) == 1:
                raise
            raise StartupError(f"model {engine.name or '(default)'}: {exc}") from None


async def stop_all(engines: Sequence[ModelEngine[Any, Any, Any]]) -> None:
    for engine in engines:
        await engine.stop()


class ModelHost(GrpcHost):
    """The gRPC host with the HTTP port beside it (DWSEARCH_HTTP_PORT; None = off): both
    start together, turn ready together and drain together on SIGTERM (new HTTP requests
    503, those in flight finish within the same grace as gRPC's calls)."""

    def __init__(self, *args: Any, http: HttpHost | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.http = http

    async def start(self) -> int:
        port = await super().start()
        if self.http is not None:
            http_port = await self.http.start()
            log.info("http listening", extra={"port": http_port})
        return port

    async def set_serving(self, serving: bool) -> None:
        await super().set_serving(serving)
        if self.http is not None:
            self.http.state.serving = serving

    async def stop(self, grace: float | None) -> None:
        if self.http is None:
            await super().stop(grace)
            return
        await asyncio.gather(super().stop(grace), self.http.drain(grace or 0.0))


async def serve_model(
    cfg: EmbedderConfig | RerankerConfig,
    make_engines: Callable[[], Sequence[E]],
    make_service: Callable[[Sequence[E]], Service],
    *,
    process: str,
    make_http: Callable[[Sequence[E], HttpState], Starlette] | None = None,
) -> None:
    """Serve until SIGTERM: NOT_SERVING while the models load and warm up, SERVING once
    every one is warm, draining in-flight calls on the signal. A StartupError (a model that
    cannot be found or loaded, contradictory settings) exits naming the process, without a
    traceback. `make_http`: the service's HTTP app over the engines, served on
    DWSEARCH_HTTP_PORT when it is set."""
    try:
        # Before any model library starts its thread pools (they are imported when the model loads).
        apply_thread_env(resolve_threads(cfg.threads))
        engines = make_engines()
        service = make_service(engines)
        http = None
        if cfg.http_port and make_http is not None:
            state = HttpState(
                service.name, auth_token=cfg.auth_token, max_request_bytes=cfg.max_request_bytes
            )
            http = HttpHost(
                make_http(engines, state), state, http_host_of(cfg.listen_addr), cfg.http_port,
                tls_cert=cfg.tls_cert, tls_key=cfg.tls_key, tls_client_ca=cfg.tls_client_ca,
            )  # fmt: skip
        host = ModelHost(
            cfg.listen_addr,
            [service],
            http=http,
            auth_token=cfg.auth_token,
            max_connection_age_s=cfg.max_connection_age_seconds,
            tls=server_tls(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca),
            health_port=cfg.health_port,
            reflection=cfg.reflection,
            # The text cap plus room for the message's framing (a few bytes per input).
            max_receive_bytes=cfg.max_request_bytes + RECEIVE_SLACK_BYTES,
        )
        serve_metrics(cfg.metrics_port)
        await run_until_signalled(
            host,
            ready=lambda: start_all(engines),
            cleanup=lambda: stop_all(engines),
            grace=cfg.grace_seconds,
            process=process,
        )
    except StartupError as exc:
        raise SystemExit(f"{process}: {exc}") from None
