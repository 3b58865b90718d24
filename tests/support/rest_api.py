"""A REST API as serve's composition root builds one (dwsearch.serve.build_application:
IndexParts, then build_rest_indexes over them, then RestApi), for tests that serve it alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg_pool import AsyncConnectionPool

from dwsearch.clients.querycache import QueryCache
from dwsearch.index.document_index import IndexParts
from dwsearch.redaction import REDACTION_ON, Redaction
from dwsearch.rest.app import DEFAULT_MAX_BODY_BYTES, RestApi
from dwsearch.rest.indexfile import RestIndexConfig
from dwsearch.rest.upstash import build_rest_indexes


def rest_api(
    pool: AsyncConnectionPool,
    configs: Sequence[RestIndexConfig],
    *,
    redaction: Redaction = REDACTION_ON,
    embedder: Any = None,
    embed_model: str = "",
    query_cache: QueryCache | None = None,
    read_pool: Any = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> RestApi:
    parts = IndexParts(pool, embedder, read_pool=read_pool, redaction=redaction, query_cache=query_cache)
    return RestApi(build_rest_indexes(parts, configs, embed_model=embed_model), max_body_bytes=max_body_bytes)
