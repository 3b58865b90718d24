"""Namespace isolation, as a property: whatever the namespaces and the filter, a read
returns exactly the documents of its own namespace that the filter matches."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dwsearch.index.filter import evaluate, parse_filter
from dwsearch.index.service import from_struct, to_struct
from dwsearch.v1 import index_pb2 as pb

DIMENSION = 32  # the fake embedder's
IDS = [f"doc-{i}" for i in range(6)]  # every namespace holds these same ids
FILTERS = [
    "",
    "appId = 'app-1'",
    "appId = 'app-1' AND type = 'conversation' AND resolution != 'escalated'",
    "appId = 'app-2' AND type = 'knowledge'",
    "type = 'response' AND trustScore > 0.85",
    "appId IN ('app-1', 'app-2') OR HAS NOT FIELD type",
    "appId GLOB 'app-*' AND type != 'knowledge'",
]

namespaces = st.lists(
    st.text(
        alphabet=st.characters(blacklist_characters="\x00\x1f", blacklist_categories=["Cs"]), max_size=12
    ),
    min_size=2,
    max_size=3,
    unique=True,
)
metadata = st.fixed_dictionaries(
    {"appId": st.sampled_from(["app-1", "app-2", "it's"])},
    optional={
        "type": st.sampled_from(["conversation", "knowledge", "response"]),
        "resolution": st.sampled_from(["refund", "escalated"]),
        "trustScore": st.sampled_from([0.5, 0.85, 0.9]),
    },
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    names=namespaces,
    contents=st.lists(st.lists(metadata, min_size=len(IDS), max_size=len(IDS)), min_size=3, max_size=3),
    filter_text=st.sampled_from(FILTERS),
    mode=st.sampled_from([pb.QUERY_MODE_DENSE, pb.QUERY_MODE_HYBRID]),
)
async def test_no_result_crosses_a_namespace(stub, names, contents, filter_text, mode):
    stored: dict[str, dict[str, dict]] = {}
    for name, metas in zip(names, contents, strict=False):
        # Upserting every id replaces whatever an earlier example left in the namespace.
        stored[name] = {doc_id: {**meta, "ns": name} for doc_id, meta in zip(IDS, metas, strict=False)}
        documents = [
            pb.Document(id=i, data=f"{name} {i}", metadata=to_struct(m)) for i, m in stored[name].items()
        ]
        await stub.Upsert(pb.UpsertRequest(namespace=name, documents=documents))
    node = parse_filter(filter_text)
    for name in names:
        expected = {doc_id for doc_id, meta in stored[name].items() if evaluate(node, meta)}
        response = await stub.Query(
            pb.QueryRequest(
                namespace=name, data="doc", filter=filter_text, top_k=100, mode=mode, include_metadata=True
            )
        )
        if mode == pb.QUERY_MODE_DENSE:  # every document is a dense neighbour; sparse needs a shared word
            assert {r.id for r in response.results} == expected
        else:
            assert {r.id for r in response.results} <= expected
        assert all(from_struct(r.metadata)["ns"] == name for r in response.results)
        fetched = await stub.Fetch(pb.FetchRequest(namespace=name, ids=IDS, include_metadata=True))
        assert [from_struct(d.metadata)["ns"] for d in fetched.documents] == [name] * len(IDS)
        page = await stub.Range(pb.RangeRequest(namespace=name, include_metadata=True))
        assert [from_struct(d.metadata)["ns"] for d in page.documents] == [name] * len(IDS)

    target, *others = names
    selector = {"filter": filter_text} if filter_text else {"prefix": "doc-"}
    deleted = await stub.Delete(pb.DeleteRequest(namespace=target, **selector))
    left = {
        doc_id for doc_id, meta in stored[target].items() if node is not None and not evaluate(node, meta)
    }
    assert deleted.deleted == len(IDS) - len(left)
    assert {d.id for d in (await stub.Range(pb.RangeRequest(namespace=target))).documents} == left
    for name in others:
        assert len((await stub.Range(pb.RangeRequest(namespace=name))).documents) == len(IDS)
