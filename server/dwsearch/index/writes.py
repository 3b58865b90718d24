"""The Index's writes (IndexWrites): upsert, update, delete, clear, a namespace dropped, rows
carried over to float32. Every request is checked in full before anything is embedded or
written; text is PII-redacted before it is embedded or stored; each write is one
transaction, applied in the order the writes arrived."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pgvector import HalfVector, SparseVector, Vector

from dwsearch.clients.embedder import (
    Embedding,
    ModelInfo,
)
from dwsearch.common import offload
from dwsearch.common.errors import InvalidArgument
from dwsearch.index import store
from dwsearch.index.base import (
    IndexBase,
    halfvec_of,
    read_filter,
)
from dwsearch.index.documents import (
    MAX_BATCH,
    MAX_DATA_BYTES,
    Document,
    MetadataMode,
    check_count,
    check_id,
    check_ids,
    check_known_names,
    check_namespace,
    check_text,
    dense_vector,
    prefix_upper_bound,
    sparse_vector,
)
from dwsearch.index.documents import sparse_vector as sparse_vector_check
from dwsearch.index.metadata import check_metadata, merge_patch
from dwsearch.index.space import PLACEHOLDER_DENSE, VectorSpace

UPSERT_DOCUMENT_COST = 2048
"""What checking one document's metadata and vector costs, in characters of text (the
unit of offload.INLINE_MAX_SIZE): an upsert of more than 8 small documents is checked in
the CPU pool, a few small ones inline."""


@dataclass(frozen=True)
class UpsertResult:
    upserted: int
    embedded: int  # distinct texts sent to the embedder


@dataclass
class _Pending:
    """A document of an upsert on its way to a row: redacted text, checked metadata, and
    its vectors once known."""

    text: str
    metadata: dict[str, Any]
    metadata_json: bytes  # serialized in the CPU pool with the checks
    dense: np.ndarray | None = None
    sparse: dict[int, float] | None = None


def _checked_metadata(documents: Sequence[Document], float32: bool) -> list[tuple[dict[str, Any], bytes]]:
    """Each document checked (everything but the vector's dimension, which needs the
    model); its metadata normalized, and serialized for the database (1,000 documents of
    48 KiB metadata: 0.3 s of json.dumps, which psycopg would do on the event loop)."""
    metadata = []
    for i, doc in enumerate(documents):
        where = f"documents[{i}]"
        check_id(doc.id, f"{where}.id")
        check_text(doc.data, f"{where}.data", max_bytes=MAX_DATA_BYTES)
        checked = check_metadata(doc.metadata, f"{where}.metadata")
        metadata.append((checked, json.dumps(checked, ensure_ascii=False, separators=(",", ":")).encode()))
        if doc.vector is not None:
            dense_vector(doc.vector, None, f"{where}.vector", float32=float32)
        elif not doc.data.strip():
            raise InvalidArgument(f"{where}: needs data or a vector")
        elif doc.sparse_vector is not None:
            raise InvalidArgument(f"{where}.sparse_vector: only with a dense vector")
    return metadata


def _pending(
    documents: Sequence[Document],
    metadata: Sequence[tuple[dict[str, Any], bytes]],
    texts: Sequence[str],
    info: ModelInfo,
    space: VectorSpace,
) -> dict[str, _Pending]:
    """An upsert's documents by id, with their given vectors in the space's stored form,
    checked against the model."""
    pending: dict[str, _Pending] = {}
    for i, (doc, (checked, serialized), text) in enumerate(zip(documents, metadata, texts, strict=True)):
        where = f"documents[{i}]"
        entry = _Pending(text, checked, serialized)
        if doc.vector is not None:
            stored = space.stored(doc.vector, f"{where}.vector")
            entry.dense = dense_vector(stored, info.dimension, f"{where}.vector", float32=space.float32)
            if doc.sparse_vector is not None:
                entry.sparse = sparse_vector(
                    doc.sparse_vector, info.sparse_dimension, f"{where}.sparse_vector"
                )
        pending.pop(doc.id, None)  # the later document takes the later position
        pending[doc.id] = entry
    return pending


def _rows(
    pending: Mapping[str, _Pending], by_text: Mapping[str, Embedding], info: ModelInfo, float32: bool = False
) -> list[store.Row]:
    """The rows to write: each document with its given vectors, or its text's embedding
    (`float32`: the dense vector as vector32, the placeholder in embedding)."""
    rows = []
    for doc_id, entry in pending.items():
        dense, sparse = entry.dense, entry.sparse
        if dense is None:
            dense, sparse = by_text[entry.text].dense, by_text[entry.text].sparse
        assert dense is not None  # _embed_documents checked every embedding
        rows.append(
            store.Row(
                doc_id,
                entry.text,
                entry.metadata,
                HalfVector(list(PLACEHOLDER_DENSE)) if float32 else HalfVector(dense),
                SparseVector(sparse, info.sparse_dimension) if sparse is not None else None,
                metadata_json=entry.metadata_json,
                vector32=dense if float32 else None,  # a Vector only as it is sent (store.upsert)
            )
        )
    return rows


class IndexWrites(IndexBase):
    """DocumentIndex's writes."""

    async def upsert(
        self, namespace: str, documents: Sequence[Document], known_names: Sequence[str] = ()
    ) -> UpsertResult:
        """Insert or replace by id, all or nothing. A later document with the same id in
        one call wins, as if upserted after the earlier one."""
        check_namespace(namespace)
        check_count(len(documents), "documents", MAX_BATCH)
        check_known_names(known_names)
        async with self._writes.turn() as turn:
            # Everything that can be checked without the model first: a bad request is
            # INVALID_ARGUMENT even while the embedder is down. A large upsert is checked,
            # and redacted, in the CPU pool.
            size = sum(len(doc.data) + UPSERT_DOCUMENT_COST for doc in documents)
            metadata = await offload.run(_checked_metadata, documents, self.space.float32, size=size)
            info = await self.model_info(fresh=True)
            texts = await self.redacted([doc.data for doc in documents], known_names)
            # Per document: vectors checked and converted (numpy), in the pool when many.
            pending = await offload.run(_pending, documents, metadata, texts, info, self.space, size=size)
            float32 = self.space.float32
            texts = list(dict.fromkeys(entry.text for entry in pending.values() if entry.dense is None))
            embeddings = await self._embed_documents(texts, info, sparse=info.sparse_supported)
            by_text = dict(zip(texts, embeddings, strict=True))
            rows = await offload.run(_rows, pending, by_text, info, float32, size=size)
            await turn.ready()  # writes that arrived earlier first (writeorder)
            async with self.pool.connection() as conn, conn.transaction():
                first_place = None
                if self.space.metric is not None:  # a REST index: its namespaces and places, as Upstash's
                    first_place = await store.take_places(conn, self._scope(namespace), len(rows))
                await store.upsert(conn, self._scope(namespace), rows, first_place=first_place)
            return UpsertResult(upserted=len(rows), embedded=len(texts))

    async def drop_namespace(self, namespace: str) -> int:
        """Delete the namespace: its documents and (a REST index's) the namespace itself."""
        check_namespace(namespace)
        async with self._writes.turn() as turn:
            await turn.ready()
            async with self.pool.connection() as conn, conn.transaction():
                # The namespace's row first, as an upsert locks it (store.take_places).
                await store.forget_namespace(conn, self._scope(namespace))
                return await store.delete_namespace(conn, namespace)

    async def update(
        self,
        namespace: str,
        doc_id: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        mode: MetadataMode = MetadataMode.PATCH,
        data: str | None = None,
        vector: Sequence[float] | None = None,
        sparse_vector: Mapping[int, float] | None = None,
        known_names: Sequence[str] = (),
    ) -> bool:
        """Patch (JSON merge patch) or overwrite a document's metadata, and / or replace its
        text (redacted, with `known_names` as upsert does) and its vectors: the text
        re-embedded when it comes alone and the space embeds text, else the vectors given
        (in the space's stored form) and the text as given. All in one transaction, the
        row locked; what is not given is kept. False when the namespace has no such
        document."""
        check_namespace(namespace)
        check_id(doc_id)
        check_known_names(known_names)
        if metadata is None and data is None and vector is None and sparse_vector is None:
            raise InvalidArgument("nothing to update: give metadata, data or vectors")
        async with self._writes.turn() as turn:
            given = check_metadata(metadata, "metadata") if metadata is not None else None
            if data is not None:
                check_text(data, "data", max_bytes=MAX_DATA_BYTES)
            changes = store.Changes()
            if data is not None and vector is None and sparse_vector is None and self.space.embeds_text:
                if not data.strip():
                    raise InvalidArgument("data: empty")
                info = await self.model_info(fresh=True)
                (redacted,) = await self.redacted([data], known_names)
                (e,) = await self._embed_documents([redacted], info, sparse=info.sparse_supported)
                sparse = SparseVector(e.sparse, info.sparse_dimension) if e.sparse is not None else None
                if self.space.float32:
                    assert e.dense is not None  # checked with the embedding
                    changes = store.Changes(
                        data=redacted, vector32=Vector(e.dense), sparse=sparse, replace_sparse=True
                    )
                else:
                    changes = store.Changes(
                        data=redacted, embedding=halfvec_of(e), sparse=sparse, replace_sparse=True
                    )
            elif data is not None or vector is not None or sparse_vector is not None:
                info = await self.model_info(fresh=True)
                embedding = vector32 = None
                if vector is not None:
                    stored = dense_vector(
                        self.space.stored(vector, "vector"),
                        info.dimension,
                        "vector",
                        float32=self.space.float32,
                    )
                    if self.space.float32:
                        vector32 = Vector(stored)
                    else:
                        embedding = HalfVector(stored)
                sparse = None
                if sparse_vector is not None:
                    checked = sparse_vector_check(sparse_vector, info.sparse_dimension, "sparse_vector")
                    sparse = SparseVector(checked, info.sparse_dimension)
                text = (await self.redacted([data], known_names))[0] if data is not None else None
                changes = store.Changes(
                    data=text,
                    embedding=embedding,
                    sparse=sparse,
                    replace_sparse=sparse is not None,
                    vector32=vector32,
                )
            scope = self._scope(namespace)
            await turn.ready()  # writes that arrived earlier first (writeorder)
            async with self.pool.connection() as conn, conn.transaction():
                current = await store.lock_metadata(conn, scope, doc_id)
                if current is None:
                    return False
                if given is None:
                    new = current
                elif mode is MetadataMode.PATCH:
                    new = check_metadata(merge_patch(current, given), "metadata (patched)")
                else:
                    new = given
                await store.update(conn, scope, doc_id, new, changes)
            return True

    async def delete(
        self,
        namespace: str,
        *,
        ids: Sequence[str] | None = None,
        prefix: str | None = None,
        filter: str | None = None,
    ) -> int:
        """Delete by ids, id prefix or filter (exactly one); documents of every model go."""
        check_namespace(namespace)
        if sum(selector is not None for selector in (ids, prefix, filter)) != 1:
            raise InvalidArgument("give exactly one of ids, prefix or filter")
        async with self._writes.turn() as turn:
            if ids is not None:
                check_ids(ids)
                await turn.ready()
                async with self.pool.connection() as conn:
                    return await store.delete_ids(conn, namespace, ids)
            if prefix is not None:
                check_id(prefix, "prefix")
                await turn.ready()
                async with self.pool.connection() as conn:
                    return await store.delete_prefix(conn, namespace, prefix, prefix_upper_bound(prefix))
            node = await read_filter(filter or "")
            if node is None:
                raise InvalidArgument("filter: empty (it would delete the whole namespace)")
            await turn.ready()
            async with (
                self._slot(),
                self.pool.connection() as conn,
                store.bounded(conn, self.statement_timeout_ms),
            ):
                return await store.delete_matching(conn, namespace, node)

    async def clear(self, namespace: str) -> int:
        """Delete every document of the namespace (documents of every model go); a REST
        index's namespace counts its places from 0 again (store.restart_places)."""
        check_namespace(namespace)
        async with self._writes.turn() as turn:
            await turn.ready()
            async with self.pool.connection() as conn, conn.transaction():
                if self.space.metric is not None:
                    await store.restart_places(conn, self._scope(namespace))
                return await store.delete_namespace(conn, namespace)

    async def carry_over_float32(self, namespace_prefix: str) -> int:
        """A float32 space's rows in the namespaces starting with `namespace_prefix` (a
        REST index's: a space over the served model is shared with the gRPC index's
        namespaces, which keep halfvec) from before it kept float32, carried over (serve's
        REST start); 0 for any other space."""
        if not self.space.float32:
            return 0
        async with self.pool.connection() as conn:
            return await store.carry_over_float32(
                conn, self.model, namespace_prefix, self.space.dimension or None
            )
