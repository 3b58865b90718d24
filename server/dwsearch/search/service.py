"""SearchService servicer: protobuf in, Searcher, protobuf out (Search and Similar)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message

from dwsearch.common.errors import InvalidArgument
from dwsearch.common.fields import (
    MAX_CHANNEL_ID_BYTES,
    MAX_PROVIDER_BYTES,
    MAX_UUID_TEXT_BYTES,
    check_length,
    check_org_id,
)
from dwsearch.common.wire import to_datetime, to_timestamp
from dwsearch.retrieval.degradation import Degradation
from dwsearch.retrieval.stages import StageTimes, stage_span
from dwsearch.search.fusion import MODEL_FREE, SOURCES, Candidate, SourceRank, check_weight
from dwsearch.search.query import (
    Conversation,
    Mode,
    SearchQuery,
    SearchResult,
    SimilarQuery,
    SimilarResult,
    Sort,
)
from dwsearch.search.rows import ContextRow
from dwsearch.search.searcher import Searcher
from dwsearch.search.store.scope import ChatScope
from dwsearch.v1 import search_pb2 as pb
from dwsearch.v1 import search_pb2_grpc as pb_grpc

SERVICE_NAME = "dwsearch.v1.SearchService"

_MODES = {
    pb.SEARCH_MODE_UNSPECIFIED: Mode.HYBRID,
    pb.SEARCH_MODE_HYBRID: Mode.HYBRID,
    pb.SEARCH_MODE_FTS: Mode.FTS,
    pb.SEARCH_MODE_SEMANTIC: Mode.SEMANTIC,
}
_MODES_PB = {
    Mode.HYBRID: pb.SEARCH_MODE_HYBRID,
    Mode.FTS: pb.SEARCH_MODE_FTS,
    Mode.SEMANTIC: pb.SEARCH_MODE_SEMANTIC,
}
_SORTS = {
    pb.SEARCH_SORT_UNSPECIFIED: Sort.RELEVANCE,
    pb.SEARCH_SORT_RELEVANCE: Sort.RELEVANCE,
    pb.SEARCH_SORT_NEWEST: Sort.NEWEST,
}
_FUSIONS = {
    pb.SEARCH_FUSION_UNSPECIFIED: None,
    pb.SEARCH_FUSION_RRF: "rrf",
    pb.SEARCH_FUSION_WEIGHTED: "weighted",
}
_FUSIONS_PB = {
    "": pb.SEARCH_FUSION_UNSPECIFIED,
    "rrf": pb.SEARCH_FUSION_RRF,
    "weighted": pb.SEARCH_FUSION_WEIGHTED,
}
_REASONS_PB = {
    Degradation.SEMANTIC_DISABLED: pb.DEGRADATION_REASON_SEMANTIC_DISABLED,
    Degradation.EMBEDDER_UNAVAILABLE: pb.DEGRADATION_REASON_EMBEDDER_UNAVAILABLE,
    Degradation.EMBEDDER_TIMEOUT: pb.DEGRADATION_REASON_EMBEDDER_TIMEOUT,
    Degradation.RERANKER_UNAVAILABLE: pb.DEGRADATION_REASON_RERANKER_UNAVAILABLE,
    Degradation.RERANKER_TIMEOUT: pb.DEGRADATION_REASON_RERANKER_TIMEOUT,
    Degradation.RERANKER_NOT_CONFIGURED: pb.DEGRADATION_REASON_RERANKER_NOT_CONFIGURED,
}


def _time(request: Message, name: str, label: str = "") -> datetime | None:
    if not request.HasField(name):
        return None
    return to_datetime(getattr(request, name), label or name)


def _check_fusion(request: pb.SearchRequest | pb.SimilarRequest) -> None:
    if request.fusion not in _FUSIONS:
        raise InvalidArgument(f"unknown fusion {request.fusion}")
    for source, weight in request.fusion_weights.items():
        try:
            check_weight(source, weight)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
    check_org_id(request.org_id)


def to_query(request: pb.SearchRequest) -> SearchQuery:
    if request.mode not in _MODES:
        raise InvalidArgument(f"unknown search mode {request.mode}")
    if request.sort not in _SORTS:
        raise InvalidArgument(f"unknown sort {request.sort}")
    _check_fusion(request)
    check_length(request.provider, "provider", MAX_PROVIDER_BYTES)
    check_length(request.external_channel_id, "external_channel_id", MAX_CHANNEL_ID_BYTES)
    return SearchQuery(
        org_id=request.org_id,
        text=request.query,
        limit=request.limit,
        provider=request.provider,
        external_channel_id=request.external_channel_id,
        start=_time(request, "start_time"),
        end=_time(request, "end_time"),
        mode=_MODES[request.mode],
        rerank=request.rerank if request.HasField("rerank") else None,
        context_messages=request.context_messages,
        sort=_SORTS[request.sort],
        fusion=_FUSIONS[request.fusion],
        fusion_weights=dict(request.fusion_weights) or None,
        explain=request.explain,
    )


def to_similar(request: pb.SimilarRequest) -> SimilarQuery:
    _check_fusion(request)
    check_length(request.message_id, "message_id", MAX_UUID_TEXT_BYTES)
    check_length(request.window_id, "window_id", MAX_UUID_TEXT_BYTES)
    conversation = None
    if request.HasField("conversation"):
        c = request.conversation
        check_length(c.provider, "conversation.provider", MAX_PROVIDER_BYTES)
        check_length(c.external_channel_id, "conversation.external_channel_id", MAX_CHANNEL_ID_BYTES)
        conversation = Conversation(
            c.provider,
            c.external_channel_id,
            _time(c, "start_time", "conversation.start_time"),
            _time(c, "end_time", "conversation.end_time"),
        )
    return SimilarQuery(
        org_id=request.org_id,
        message_id=request.message_id,
        window_id=request.window_id,
        conversation=conversation,
        limit=request.limit,
        context_messages=request.context_messages,
        fusion=_FUSIONS[request.fusion],
        fusion_weights=dict(request.fusion_weights) or None,
        explain=request.explain,
    )


def _source(rank: SourceRank) -> pb.SourceScore:
    return pb.SourceScore(rank=rank.rank, score=rank.score)


def _context(rows: Sequence[ContextRow]) -> list[pb.ContextMessage]:
    return [pb.ContextMessage(id=r.id, created_at=to_timestamp(r.created_at), text=r.text) for r in rows]


def legs(c: Candidate, model: str = "") -> dict[str, SourceRank]:
    """The legs that found the hit by source ("fts", "dense:<model>", ...): a bare "dense" or
    "sparse" that only aliases a named leg is left out, one without a named leg (a single
    model's) is named after `model`."""
    out = {}
    for source, rank in c.sources.items():
        if not rank.rank:
            continue
        if source in SOURCES and source not in MODEL_FREE:
            if any(other.startswith(f"{source}:") for other in c.sources):
                continue
            source = f"{source}:{model}" if model else source
        out[source] = rank
    return out


def _explanation(c: Candidate) -> pb.SearchHitExplanation:
    return pb.SearchHitExplanation(
        legs=[
            pb.SearchLegExplanation(
                leg=part.source, rank=part.rank, raw_score=part.score, normalized_score=part.normalized,
                weight=part.weight,
            )
            for part in c.explanation
        ],
        fused_score=c.fused,
        rerank_score=c.rerank.score if c.rerank.rank else None,
    )  # fmt: skip


def to_hit(c: Candidate, model: str = "", explain: bool = False) -> pb.SearchHit:
    return pb.SearchHit(
        kind=pb.HIT_KIND_WINDOW if c.kind == "window" else pb.HIT_KIND_MESSAGE,
        id=c.id,
        message_ids=c.message_ids,
        matched_message_ids=c.matched_message_ids,
        provider=c.provider,
        external_channel_id=c.external_channel_id,
        start_time=to_timestamp(c.start),
        end_time=to_timestamp(c.end),
        text=c.text,
        score=c.score,
        fts=_source(c.sources["fts"]),
        dense=_source(c.sources["dense"]),
        sparse=_source(c.sources["sparse"]),
        rerank=_source(c.rerank),
        highlights=[pb.TextSpan(start=start, end=end) for start, end in c.highlights],
        context_before=_context(c.context_before),
        context_after=_context(c.context_after),
        sources={s: _source(r) for s, r in legs(c, model).items()},
        explanation=_explanation(c) if explain else None,
    )


def _stage_times(stages: StageTimes) -> list[pb.SearchStageTime]:
    out = []
    for stage, seconds in stages:
        duration = Duration()
        duration.FromNanoseconds(round(seconds * 1e9))
        out.append(pb.SearchStageTime(stage=stage, duration=duration))
    return out


def _answer(result: SearchResult | SimilarResult) -> dict[str, Any]:
    """The fields SearchResponse and SimilarResponse share."""
    return {
        "hits": [to_hit(c, result.model, result.explain) for c in result.hits],
        "degraded": bool(result.degradations),
        "degradations": [pb.Degradation(reason=_REASONS_PB[r], detail=d) for r, d in result.degradations],
        "model": result.model,
        "fusion": _FUSIONS_PB[result.fusion],
        "fusion_profile": result.fusion_profile if result.explain else "",
        "stage_times": _stage_times(result.stage_times),
    }


def to_response(result: SearchResult) -> pb.SearchResponse:
    return pb.SearchResponse(
        **_answer(result),
        mode=_MODES_PB[result.mode],
        reranked=result.reranked,
        typo_corrections=[
            pb.TypoCorrection(term=e.term, corrections=list(e.alternatives)) for e in result.typo_corrections
        ],
    )


def _conversation(scope: ChatScope) -> pb.Conversation:
    conversation = pb.Conversation(provider=scope.provider, external_channel_id=scope.external_channel_id)
    if scope.start is not None:
        conversation.start_time.CopyFrom(to_timestamp(scope.start))
    if scope.end is not None:
        conversation.end_time.CopyFrom(to_timestamp(scope.end))
    return conversation


def to_similar_response(result: SimilarResult) -> pb.SimilarResponse:
    return pb.SimilarResponse(
        **_answer(result),
        conversation=_conversation(result.conversation),
        embedded_models=result.embedded_models,
    )


class SearchService(pb_grpc.SearchServiceServicer):
    def __init__(self, searcher: Searcher) -> None:
        self.searcher = searcher

    async def Search(
        self, request: pb.SearchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SearchResponse:
        result = await self.searcher.search(to_query(request))
        if not result.explain:
            return to_response(result)
        with stage_span("explain"):  # the hits' explanations written
            return to_response(result)

    async def Similar(
        self, request: pb.SimilarRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SimilarResponse:
        return to_similar_response(await self.searcher.similar(to_similar(request)))
