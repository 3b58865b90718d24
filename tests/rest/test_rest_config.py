"""DWSEARCH_REST_INDEXES: what a bad file says; and internal errors never reach the client."""

from __future__ import annotations

import httpx
import psycopg
import pytest

from dwsearch.common.errors import StartupError
from dwsearch.rest.app import RestIndex
from dwsearch.rest.indexfile import load_indexes, parse_indexes

GOOD = '[[index]]\nname = "a"\ntoken = ["t1", "t2"]\ndimension = 4\nmetric = "dot_product"\n'


def test_a_good_file(tmp_path):
    path = tmp_path / "i.toml"
    path.write_text(GOOD)
    (index,) = load_indexes(str(path))
    assert (index.name, index.tokens, index.dimension, index.metric, index.type) == (
        "a",
        ("t1", "t2"),
        4,
        "DOT_PRODUCT",
        "DENSE",
    )
    (sparse,) = parse_indexes('[[index]]\nname = "s"\ntoken = "t"\ntype = "sparse"\nsparse_model = "bm25"\n')
    assert sparse.type == "SPARSE" and sparse.sparse_model == "BM25" and sparse.dimension == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not toml [", "not TOML"),
        ("", r"no \[\[index\]\]"),
        ('[[index]]\nname = "query"\ntoken = "t"\ndimension = 2\n', "name"),
        ('[[index]]\nname = "a"\ntoken = ""\ndimension = 2\n', "token"),
        (GOOD + GOOD.replace('name = "a"', 'name = "b"'), "a token of index 'a'"),
        (GOOD + GOOD, "given twice"),
        ('[[index]]\nname = "a"\ntoken = "t"\ndimension = 2\nmetric = "HAMMING"\n', "metric"),
        ('[[index]]\nname = "a"\ntoken = "t"\n', "dimension"),
        ('[[index]]\nname = "a"\ntoken = "t"\ndimension = 20000\n', "dimension"),
        ('[[index]]\nname = "a"\ntoken = "t"\ntype = "SPARSE"\ndimension = 2\n', "SPARSE"),
        (
            '[[index]]\nname = "a"\ntoken = "t"\ntype = "HYBRID"\ndimension = 2\nsparse_model = "BM25"\n',
            "both",
        ),
        ('[[index]]\nname = "a"\ntoken = "t"\ndimension = 2\nsparse_model = "BM25"\n', "DENSE"),
        ('[[index]]\nname = "a"\ntoken = "t"\ndense_model = "default"\nmetric = "EUCLIDEAN"\n', "COSINE"),
        ('[[index]]\nname = "a"\ntoken = "t"\ndimension = 2\ncolour = "red"\n', "unknown keys"),
    ],
)
def test_a_bad_file_says_what_is_wrong(text, message):
    with pytest.raises(StartupError, match=message):
        parse_indexes(text)


def test_an_unreadable_file(tmp_path):
    with pytest.raises(StartupError, match="cannot read"):
        load_indexes(str(tmp_path / "missing.toml"))


async def test_internal_errors_leak_no_sql(rest_url, monkeypatch):
    async def broken(self, namespace, body):
        raise psycopg.errors.UndefinedColumn(
            'column "secret" does not exist: SELECT secret FROM dw_index_documents'
        )

    monkeypatch.setattr(RestIndex, "fetch", broken)
    async with httpx.AsyncClient(base_url=rest_url) as http:
        response = await http.post(
            "/fetch", headers={"Authorization": "Bearer dense-token"}, json={"ids": ["a"]}
        )
    assert response.status_code == 500 and response.json() == {"error": "internal error"}
    from prometheus_client import REGISTRY

    assert (
        REGISTRY.get_sample_value(
            "dwsearch_rest_requests_total", {"index": "dense", "endpoint": "fetch", "status": "500"}
        )
        >= 1
    )
