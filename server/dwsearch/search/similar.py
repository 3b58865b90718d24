"""Similar (SearchService.Similar): the org's windows most like one conversation, its own
windows left out. The conversation is a window's channel and span, a message's windows'
span (or its open session while no window holds it), or a channel and span given; each
model's vector for it is its windows' mean or, with none, its latest messages embedded now;
then the same KNN legs, fusion and context as Search (dwsearch.search.legs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgvector import HalfVector, SparseVector
from psycopg import AsyncConnection

from dwsearch.clients.embedder import Embedding, ModelInfo
from dwsearch.clients.queryembedder import check_embedding
from dwsearch.common import metrics
from dwsearch.common.errors import DeadlineExceeded, DwsearchError, FailedPrecondition, NotFound, Unavailable
from dwsearch.db.readpool import read_retrying
from dwsearch.flags import disabled_reasons
from dwsearch.retrieval import candidates as candidate_policy
from dwsearch.retrieval.degradation import Degradation
from dwsearch.retrieval.pipeline import legs_at_once
from dwsearch.retrieval.stages import explained, explaining
from dwsearch.search.conversation import (
    OPEN_CONVERSATION_MESSAGES,
    OPEN_SESSION_REACH,
    conversation_text,
    mean_vectors,
    session_around,
)
from dwsearch.search.legs import (
    MODEL_LEG_TASK,
    ActiveModel,
    ChatLegs,
    ModelLegs,
    knn_vectors,
)
from dwsearch.search.query import SimilarQuery, SimilarResult, canonical_uuid, validate_similar
from dwsearch.search.rows import ContextRow
from dwsearch.search.store import conversations
from dwsearch.search.store.scope import ChatScope


@dataclass(frozen=True)
class _Conversation:
    """Similar's conversation: its org, provider, channel and time span (its windows are
    the channel's that overlap the span), and its messages when already read."""

    scope: ChatScope
    messages: list[ContextRow] | None = None


class SimilarSearch:
    """Similar over chat search's legs. `document_timeout`: an open conversation embedded
    now is a document-sized input, so its deadline is the reranker's
    (DWSEARCH_RERANK_TIMEOUT_MS) rather than a query's."""

    def __init__(self, legs: ChatLegs, *, document_timeout: float) -> None:
        self.legs = legs
        self.document_timeout = document_timeout

    async def __call__(self, query: SimilarQuery) -> SimilarResult:
        """The org's embedded windows most like the conversation, its own windows left out:
        each model's dense (and sparse) KNN from the conversation's vectors, fused."""
        return await read_retrying(self.legs.pool, lambda: self._similar(query))

    async def _similar(self, query: SimilarQuery) -> SimilarResult:
        limit = validate_similar(query)
        if not await self.legs.semantic_enabled(query.org_id):
            async with self.legs.pool.connection() as conn:
                why = (await disabled_reasons(conn, [query.org_id])).get(query.org_id, "")
            raise FailedPrecondition(f"semantic search is off for org {query.org_id!r}: {why}".rstrip(": "))
        with explaining(query.explain) as stages:
            conversation, windows = await explained("conversation", self._conversation(query))
            per_source = candidate_policy.per_leg(limit)
            async with legs_at_once() as legs:
                per_model = [
                    legs.create_task(
                        self._similar_legs(m, conversation, windows.get(m.name, []), per_source),
                        name=MODEL_LEG_TASK,
                    )
                    for m in self.legs.active
                ]
            answers = [task.result() for task in per_model]
            problems = [a.degradation for a in answers if a.degradation is not None]
            if problems and len(problems) == len(answers):
                details = "; ".join(detail for _, detail in problems)
                timeouts = all(reason is Degradation.EMBEDDER_TIMEOUT for reason, _ in problems)
                error = DeadlineExceeded if timeouts else Unavailable
                raise error(f"no model could embed the open conversation: {details}")
            plan = self.legs.fusion_for(query.fusion, query.fusion_weights, limit, query.explain)
            fusion = plan.method
            hits = self.legs.fused([leg for a in answers for leg in a.legs], plan)[:limit]
            await self.legs.add_context(query.org_id, hits, query.context_messages)
        for reason, _ in problems:
            metrics.SEARCH_DEGRADED.labels(reason.value).inc()
        return SimilarResult(
            hits=hits,
            conversation=conversation.scope,
            model=",".join(self.legs.models),
            fusion=fusion,
            fusion_profile=self.legs.settings.profile.name,
            degradations=problems,
            embedded_models=[m.name for m, a in zip(self.legs.active, answers, strict=True) if a.embedded],
            explain=query.explain,
            stage_times=stages,
        )

    async def _conversation(
        self, query: SimilarQuery
    ) -> tuple[_Conversation, dict[str, list[tuple[HalfVector, SparseVector | None]]]]:
        """The conversation Similar matches, and each model's embedded windows of it; its
        messages are read too when a model has no window of it (they are embedded then).
        NotFound for a message or window the org does not have, or a conversation without
        an eligible message or window."""
        org = query.org_id
        async with self.legs.pool.connection() as conn:
            conversation = await self._anchor(conn, query)
            windows = await conversations.conversation_windows(conn, conversation.scope, self.legs.models)
            if conversation.messages is None and len(windows) < len(self.legs.models):
                messages = await conversations.conversation_messages(
                    conn, conversation.scope, OPEN_CONVERSATION_MESSAGES
                )
                conversation = _Conversation(conversation.scope, messages)
        if not windows and not conversation.messages:
            raise NotFound(f"org {org!r} has no eligible message in that conversation")
        return conversation, windows

    async def _anchor(self, conn: AsyncConnection[Any], query: SimilarQuery) -> _Conversation:
        """The request's conversation: a window's channel and span; a message's windows'
        span, or while none holds it its open session; or the conversation given."""
        org = query.org_id
        if query.window_id:
            scope = await conversations.window_conversation(
                conn, org, canonical_uuid(query.window_id, "window_id", "window")
            )
            if scope is None:
                raise NotFound(f"org {org!r} has no window {query.window_id!r}")
            return _Conversation(scope)
        if query.message_id:
            message_id = canonical_uuid(query.message_id, "message_id", "dw_chat_events")
            anchor = await conversations.message_anchor(conn, org, message_id, self.legs.models)
            if anchor is None:
                raise NotFound(f"org {org!r} has no eligible message {query.message_id!r}")
            channel = (org, anchor.provider, anchor.external_channel_id)
            if anchor.windows_start is not None:
                return _Conversation(ChatScope(*channel, anchor.windows_start, anchor.windows_end))
            # No window holds it yet: its session, as far as it goes.
            [(before, after)] = await conversations.context_messages(
                conn, org, [(message_id, message_id)], OPEN_SESSION_REACH
            )
            session = session_around(before, anchor.message, after)
            return _Conversation(
                ChatScope(*channel, session[0].created_at, session[-1].created_at),
                session[-OPEN_CONVERSATION_MESSAGES:],
            )
        c = query.conversation
        assert c is not None  # validate_similar: exactly one is given
        return _Conversation(ChatScope(org, c.provider, c.external_channel_id, c.start, c.end))

    async def _similar_legs(
        self,
        model: ActiveModel,
        conversation: _Conversation,
        windows: list[tuple[HalfVector, SparseVector | None]],
        k: int,
    ) -> ModelLegs:
        """`model`'s KNN legs from the conversation's windows (their mean), or, when the
        model has none of it, from its messages embedded now; its own windows left out."""
        embedded = not windows
        if windows:
            dense, sparse = mean_vectors(windows)
        elif not conversation.messages:
            return ModelLegs([])  # windows of other models only, and no message left to embed
        else:
            text = conversation_text(conversation.messages, self.legs.redaction.text)
            try:
                info, embedding = await explained(
                    f"embed:{model.name}", self._document_embedding(model, text)
                )
            except DwsearchError as exc:
                return ModelLegs([], self.legs.left_out(model, exc))
            dense, sparse = knn_vectors(model, info, embedding)
        scope = ChatScope(conversation.scope.org_id)
        legs = await self.legs.knn_legs(model, scope, dense, sparse, k, exclude=conversation.scope)
        return ModelLegs(legs, embedded=embedded)

    async def _document_embedding(self, model: ActiveModel, text: str) -> tuple[ModelInfo, Embedding]:
        """`text` embedded by `model` as the sweep embeds a window (a document, dense and,
        where the model has them, sparse), in the interactive lane, through the model's
        breaker, never cached nor stored. A conversation is a document-sized input, so its
        deadline is the reranker's (DWSEARCH_RERANK_TIMEOUT_MS) rather than a query's."""
        queries = model.queries
        info = await queries.info()

        async def embed() -> Embedding:
            (embedding,) = await queries.embedder.embed(
                [text], sparse=info.sparse_supported, truncate=True, priority="interactive",
                timeout=self.document_timeout, expected_model=info.model_id,
            )  # fmt: skip
            return embedding

        embedding = await (embed() if queries.breaker is None else queries.breaker.call(embed))
        check_embedding(embedding, info, dense=True, sparse=info.sparse_supported)
        return info, embedding
