"""Knowledge gaps (docs/support-index.md, "Knowledge gaps"): the questions the support app's knowledge
articles do not answer, recorded per org and listed grouped by similarity.

**Org.** The Index's tenant is the app id every agent-context query filters on, so a gap's
org is BuildAgentContextRequest.app_id, or the `appId = '<app>'` of a knowledge query. The
opt-in flag (dwsearch.flags.KNOWLEDGE_GAPS_FLAG), SweepService.Purge and the admin RPCs
name it as org_id; an app id longer than an org id may be (MAX_ORG_ID_BYTES) is never
recorded, since no Purge could name it.

**Recording.** For an org that opted in, an agent-context message, or an Index Query by
text of the knowledge section (a filter ANDing `appId = '<app>'` and `type = 'knowledge'`,
other conditions allowed), whose best knowledge score is under the threshold
(DWSEARCH_KNOWLEDGE_GAP_THRESHOLD) is recorded: its redacted text, its time, the best score
and the ids of the GAP_NEAREST_ARTICLES nearest knowledge articles. The best knowledge score is
the dense similarity (inner product of unit vectors: cosine) of the question and the
nearest knowledge article of the app in the namespace, whatever mode or rerank the answer
used: fused and reranker scores have no fixed scale to hold a threshold against. An app
with no knowledge article at all records a gap without a score. The text is redacted
exactly as index writes are (dwsearch.redaction with the request's known names), even
where DWSEARCH_REDACT is off: nothing unredacted is stored.

Recording never touches the answer: it starts once the answer is built and runs in the
background, at most GAP_RECORDS_IN_FLIGHT at once (each a flag look-up cached for
GAPS_FLAG_TTL_S, one dense KNN of GAP_NEAREST_ARTICLES rows and one insert) with at most
MAX_PENDING_GAPS waiting; beyond that an observation is dropped. A failure or a drop is
logged and counted (dwsearch_knowledge_gap_failures_total), never raised.

**Listing.** The org's MAX_LISTED_GAPS most recent gaps: identical questions counted
together, the distinct ones embedded by the embedder as queries (interactive lane), then
grouped greedily, most frequent question first: each joins the group whose first question
is the most similar to it at cosine >= GAP_CLUSTER_SIMILARITY, or starts one. Groups come
most frequent first (then the most recently seen).

**Deletion.** SweepService.Purge deletes an org's gaps recorded before its cutoff (the
org's retention; dwsearch.sweep.store.retention.purge), ForgetKnowledgeGaps the ones it
names, or all of the org's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

import numpy as np
from prometheus_client import Counter

from dwsearch import flags
from dwsearch.clients.queryembedder import check_embedding
from dwsearch.common import offload
from dwsearch.common.errors import Internal, InvalidArgument
from dwsearch.common.fields import MAX_ORG_ID_BYTES, distinct_ids
from dwsearch.common.ttlcache import TtlCache
from dwsearch.index import gapstore
from dwsearch.index.base import EMBED_BATCH_INPUTS, FILTER_INLINE_MAX, QueryVectors
from dwsearch.index.document_index import DocumentIndex
from dwsearch.index.documents import Fusion, Include, Query, QueryMode, check_text
from dwsearch.index.filter import And, Compare, Node, parse_filter
from dwsearch.index.gapstore import GapRow, NewGap
from dwsearch.redaction import REDACTION_ON

log = logging.getLogger(__name__)

GAP_NEAREST_ARTICLES = 3
"""Nearest knowledge articles whose ids a gap keeps (the first one's score is its best)."""
GAP_CLUSTER_SIMILARITY = 0.85
"""Two questions whose query embeddings have at least this cosine similarity are grouped
(near duplicates: "how do I reset my password" / "how to reset password")."""
MAX_LISTED_GAPS = 1000
"""The most recent gaps of an org one listing groups (each distinct one embedded)."""
DEFAULT_GAP_GROUPS = 20
MAX_GAP_GROUPS = 100
MAX_GROUP_EXAMPLES = 3
GAP_RECORDS_IN_FLIGHT = 2
"""Recordings running at once: each may hold a pool connection, so that they never take
many from the requests'."""
MAX_PENDING_GAPS = 64
"""Recordings waiting for their turn; another observation is dropped and counted."""
GAPS_FLAG_TTL_S = 5.0
"""How long an org's opt-in answer is reused (as Search caches its flags)."""

GAPS_RECORDED = Counter(
    "dwsearch_knowledge_gaps_recorded_total",
    "Knowledge gaps recorded (agent-context messages or knowledge queries of opted-in orgs under the threshold)",
)
GAP_FAILURES = Counter(
    "dwsearch_knowledge_gap_failures_total",
    "Knowledge gaps not recorded: error (a failure while recording, logged) or busy (too many waiting; dropped)",
    ["reason"],
)


@dataclass(frozen=True)
class GapGroup:
    query: str  # the group's most frequent question
    count: int
    examples: list[str]
    first_seen: datetime
    last_seen: datetime
    best_score: float | None
    candidate_ids: list[str]  # of the group's latest gap
    gap_ids: list[str]


@dataclass(frozen=True)
class GapListing:
    groups: list[GapGroup]
    gaps: int  # gaps grouped
    truncated: bool  # the org has more than were grouped
    similarity: float


def _utcnow() -> datetime:
    return datetime.now(UTC)


def check_org_id(org_id: str) -> None:
    if not org_id.strip():
        raise InvalidArgument("org_id: required")
    check_text(org_id, "org_id", max_bytes=MAX_ORG_ID_BYTES)


def knowledge_org(node: Node | None) -> str | None:
    """The app id of a knowledge-section filter (`appId = '<app>' AND type = 'knowledge'`,
    with any other conditions ANDed); None for any other filter."""
    terms: list[Node] = []
    pending: list[Node] = [node] if node is not None else []
    while pending:
        term = pending.pop()
        if isinstance(term, And):
            pending.extend(term.operands)
        else:
            terms.append(term)
    compares = [t for t in terms if isinstance(t, Compare) and t.op == "=" and isinstance(t.value, str)]
    apps = {str(t.value) for t in compares if t.path == ("appId",)}
    knowledge = any(t.path == ("type",) and t.value == "knowledge" for t in compares)
    return apps.pop() if knowledge and len(apps) == 1 else None


def group_gaps(
    rows: Sequence[GapRow], vectors: Mapping[str, np.ndarray], similarity: float
) -> list[GapGroup]:
    """Gaps grouped: identical questions together, then each distinct
    question, most frequent (then most recently asked) first, into the group whose first
    question is the most similar to it at cosine >= `similarity`, else a new one. Most
    frequent group first."""
    by_text: dict[str, list[GapRow]] = {}
    for row in rows:
        by_text.setdefault(row.query, []).append(row)
    latest = {text: max(r.created_at for r in found).timestamp() for text, found in by_text.items()}
    texts = sorted(by_text, key=lambda t: (-len(by_text[t]), -latest[t], t))
    if not texts:
        return []
    firsts = np.zeros((len(texts), len(vectors[texts[0]])), dtype=np.float32)
    members: list[list[str]] = []
    for text in texts:
        vector = np.asarray(vectors[text], dtype=np.float32)
        norm = float(np.linalg.norm(vector))
        vector = vector / norm if norm else vector
        if members:
            similarities = firsts[: len(members)] @ vector
            nearest = int(np.argmax(similarities))
            if similarities[nearest] >= similarity:
                members[nearest].append(text)
                continue
        firsts[len(members)] = vector
        members.append([text])
    groups = [_group(questions, by_text) for questions in members]
    groups.sort(key=lambda g: (-g.count, -g.last_seen.timestamp(), g.query))
    return groups


def _group(questions: Sequence[str], by_text: Mapping[str, Sequence[GapRow]]) -> GapGroup:
    rows = [row for text in questions for row in by_text[text]]
    latest = max(rows, key=lambda r: r.created_at)
    scores = [r.best_score for r in rows if r.best_score is not None]
    return GapGroup(
        query=questions[0],
        count=len(rows),
        examples=list(questions[1 : 1 + MAX_GROUP_EXAMPLES]),
        first_seen=min(r.created_at for r in rows),
        last_seen=latest.created_at,
        best_score=max(scores) if scores else None,
        candidate_ids=list(latest.candidate_ids),
        gap_ids=[str(r.id) for r in rows],
    )


def _failed(exc: Exception) -> None:
    GAP_FAILURES.labels("error").inc()
    log.warning("knowledge gap not recorded", extra={"error": str(exc), "error_type": type(exc).__name__})


class KnowledgeGaps:
    """Records an index's knowledge gaps (observe, observe_query: never raise, never
    wait) and lists or deletes an org's (list_gaps, forget)."""

    def __init__(
        self,
        index: DocumentIndex,
        *,
        threshold: float,
        similarity: float = GAP_CLUSTER_SIMILARITY,
        clock: Callable[[], datetime] = _utcnow,
        flag_ttl: float = GAPS_FLAG_TTL_S,
    ) -> None:
        self.index = index
        self.threshold = threshold
        self.similarity = similarity
        self._clock = clock
        self._opt_ins: TtlCache[str, bool] = TtlCache(flag_ttl, name="knowledge_gap_opt_ins")
        self._in_flight = asyncio.Semaphore(GAP_RECORDS_IN_FLIGHT)
        self._pending: set[asyncio.Task[None]] = set()

    # --- Recording -------------------------------------------------------------------

    def observe(
        self,
        namespace: str,
        org_id: str,
        vectors: QueryVectors,
        knowledge: Node,
        *,
        known_names: Sequence[str] = (),
    ) -> None:
        """An agent context's message (`vectors`, as embedded), for the knowledge filter
        `knowledge`: recorded in the background if it is a gap."""
        if self._opt_ins.get(org_id) is False:
            return  # known not to be opted in: nothing to start
        names = tuple(known_names)
        self._spawn(lambda asked_at: self._record(namespace, org_id, vectors, knowledge, names, asked_at))

    def observe_query(self, query: Query) -> None:
        """An Index Query: recorded in the background if it is by text, of the knowledge
        section and a gap."""
        if query.data is None or "knowledge" not in query.filter:
            return
        self._spawn(lambda asked_at: self._record_query(query, asked_at))

    async def drain(self) -> None:
        """Wait for every recording started (tests; a server about to stop)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    def _spawn(self, work: Callable[[datetime], Awaitable[None]]) -> None:
        """`work(now)` started in the background; never raises."""
        try:
            if len(self._pending) >= MAX_PENDING_GAPS:
                GAP_FAILURES.labels("busy").inc()
                log.warning(
                    "knowledge gap not recorded: too many waiting", extra={"pending": len(self._pending)}
                )
                return
            task = asyncio.get_running_loop().create_task(self._guarded(work, self._clock()))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        except Exception as exc:
            _failed(exc)

    async def _guarded(self, work: Callable[[datetime], Awaitable[None]], asked_at: datetime) -> None:
        try:
            async with self._in_flight:
                await work(asked_at)
        except Exception as exc:
            _failed(exc)

    async def _record_query(self, query: Query, asked_at: datetime) -> None:
        text = query.filter
        node = parse_filter(text) if len(text) <= FILTER_INLINE_MAX else await offload.run(parse_filter, text)
        org_id = knowledge_org(node)
        if org_id is None or node is None:
            return
        if not self._storable(org_id) or not await self._opted_in(org_id):
            return
        assert query.data is not None  # observe_query's check
        # The vectors the Query was answered with (so the query cache answers): dense, and
        # sparse where the model has it, unless it asked for DENSE.
        mode = QueryMode.DENSE if query.mode is QueryMode.DENSE else None
        vectors = await self.index.embed_query(query.data, mode=mode)
        await self._record_if_gap(query.namespace, org_id, vectors, node, (), asked_at)

    async def _record(
        self,
        namespace: str,
        org_id: str,
        vectors: QueryVectors,
        knowledge: Node,
        known_names: tuple[str, ...],
        asked_at: datetime,
    ) -> None:
        if not self._storable(org_id) or not await self._opted_in(org_id):
            return
        await self._record_if_gap(namespace, org_id, vectors, knowledge, known_names, asked_at)

    async def _record_if_gap(
        self,
        namespace: str,
        org_id: str,
        vectors: QueryVectors,
        knowledge: Node,
        known_names: tuple[str, ...],
        asked_at: datetime,
    ) -> None:
        if vectors.dense is None:
            return  # a space without dense vectors has no similarity to judge by
        dense = dataclasses.replace(vectors, sparse=None)
        hits = await self.index.by_vectors(
            namespace, dense, GAP_NEAREST_ARTICLES, knowledge, Fusion.RRF, Include()
        )
        best = hits[0].score if hits else None
        if best is not None and best >= self.threshold:
            return
        gap = NewGap(
            org_id=org_id,
            query=await self._redacted(vectors.text, known_names),
            best_score=best,
            candidate_ids=[h.document.id for h in hits],
            created_at=asked_at,
        )
        async with self.index.pool.connection() as conn:
            await gapstore.record(conn, gap)
        GAPS_RECORDED.inc()

    async def _redacted(self, text: str, known_names: tuple[str, ...]) -> str:
        """The question as stored: as embedded where the index redacts (the same
        redaction as its writes), else redacted here."""
        if self.index.redaction.enabled:
            return text
        (redacted,) = await REDACTION_ON.texts([text], known_names)
        return redacted

    def _storable(self, org_id: str) -> bool:
        if len(org_id.encode()) <= MAX_ORG_ID_BYTES:
            return True
        log.info("knowledge gap not recorded: the app id is longer than an org id may be")
        return False

    async def _opted_in(self, org_id: str) -> bool:
        known = self._opt_ins.get(org_id)
        if known is None:
            async with self.index.pool.connection() as conn:
                known = await flags.knowledge_gaps_enabled(conn, org_id)
            self._opt_ins.put(org_id, known)
        return known

    # --- Listing and deletion ----------------------------------------------------------

    async def list_gaps(self, org_id: str, *, since: datetime | None = None, limit: int = 0) -> GapListing:
        """The org's gaps grouped, most frequent first: at most `limit` groups (0:
        DEFAULT_GAP_GROUPS), of its MAX_LISTED_GAPS most recent gaps since `since`."""
        check_org_id(org_id)
        if not 0 <= limit <= MAX_GAP_GROUPS:
            raise InvalidArgument(
                f"limit: {limit}; 1 to {MAX_GAP_GROUPS} allowed (0 means {DEFAULT_GAP_GROUPS})"
            )
        if since is not None and since > self._clock():
            raise InvalidArgument(f"since: {since.isoformat()} is in the future")
        async with self.index.pool.connection() as conn:
            rows = await gapstore.recent(conn, org_id, since, MAX_LISTED_GAPS + 1)
        truncated = len(rows) > MAX_LISTED_GAPS
        rows = rows[:MAX_LISTED_GAPS]
        texts = list(dict.fromkeys(row.query for row in rows))
        vectors = await self._embed(texts)
        dimension = len(next(iter(vectors.values()))) if vectors else 0
        groups = await offload.run(
            group_gaps, rows, vectors, self.similarity, size=len(texts) * max(dimension, 1)
        )
        return GapListing(groups[: limit or DEFAULT_GAP_GROUPS], len(rows), truncated, self.similarity)

    async def _embed(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Each text's dense query embedding (the interactive lane, EMBED_BATCH_INPUTS a call)."""
        if not texts:
            return {}
        info = await self.index.model_info()
        vectors: dict[str, np.ndarray] = {}
        for start in range(0, len(texts), EMBED_BATCH_INPUTS):
            batch = texts[start : start + EMBED_BATCH_INPUTS]
            embeddings = await self.index.embedder.embed(
                batch, input_type="query", dense=True, sparse=False, truncate=True, priority="interactive"
            )
            if len(embeddings) != len(batch):
                raise Internal(f"embedder returned {len(embeddings)} embeddings for {len(batch)} texts")
            for text, embedding in zip(batch, embeddings, strict=True):
                check_embedding(embedding, info, dense=True, sparse=False)
                assert embedding.dense is not None  # checked
                vectors[text] = embedding.dense
        return vectors

    async def forget(self, org_id: str, ids: Sequence[str] = (), *, all_gaps: bool = False) -> int:
        """Delete the org's gaps named by `ids`, or all of them; how many went."""
        check_org_id(org_id)
        if all_gaps and ids:
            raise InvalidArgument("ids and all: give one of them, not both")
        if not all_gaps and not ids:
            raise InvalidArgument("ids: required (or all)")
        uuids: list[UUID] | None = None
        if not all_gaps:
            uuids = []
            for text in distinct_ids(ids, "ids"):
                try:
                    uuids.append(UUID(text))
                except ValueError:
                    raise InvalidArgument(f"ids: {text!r} is not a knowledge gap id (UUID)") from None
        async with self.index.pool.connection() as conn:
            deleted = await gapstore.forget(conn, org_id, uuids)
        if deleted:
            log.info("forgot knowledge gaps", extra={"org_id": org_id, "gaps": deleted})
        return deleted
