"""The REST API over serve's TLS settings: TLS, and mutual TLS with DWSEARCH_TLS_CLIENT_CA."""

from __future__ import annotations

import ssl

import httpx
import pytest
from rel_pki import make_pki, openssl_missing
from rest_api import rest_api
from upstash_vector import AsyncIndex

from dwsearch.redaction import REDACTION_OFF
from dwsearch.rest.indexfile import parse_indexes
from dwsearch.rest.server import RestServer

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(bool(openssl_missing()), reason="no openssl")]
INDEX = '[[index]]\nname = "t"\ntoken = "tok"\ndimension = 2\n'


async def test_tls_and_mutual_tls(pool, tmp_path):
    pki = make_pki(tmp_path / "pki")
    api = rest_api(pool, parse_indexes(INDEX), redaction=REDACTION_OFF)
    server = RestServer(api, "127.0.0.1", 0, tls_cert=pki.path("server.pem"), tls_key=pki.path("server.key"))
    await server.start()
    try:
        url = f"https://127.0.0.1:{server.port}"
        index = AsyncIndex(url=url, token="tok", retries=0)
        index._client = httpx.AsyncClient(verify=ssl.create_default_context(cafile=pki.path("ca.pem")))
        await index.upsert(vectors=[("a", [1.0, 0.0])])
        assert (await index.info()).vector_count == 1
        await index._client.aclose()
    finally:
        await server.stop()
    mutual = RestServer(
        api, "127.0.0.1", 0,
        tls_cert=pki.path("server.pem"), tls_key=pki.path("server.key"), tls_client_ca=pki.path("ca.pem"),
    )  # fmt: skip
    await mutual.start()
    try:
        url = f"https://127.0.0.1:{mutual.port}/info"
        context = ssl.create_default_context(cafile=pki.path("ca.pem"))
        async with httpx.AsyncClient(verify=context) as anonymous:
            with pytest.raises(httpx.HTTPError):
                await anonymous.post(url, headers={"Authorization": "Bearer tok"})
        context.load_cert_chain(pki.path("client.pem"), pki.path("client.key"))
        async with httpx.AsyncClient(verify=context) as client:
            response = await client.post(url, headers={"Authorization": "Bearer tok"})
            assert response.status_code == 200 and response.json()["result"]["vectorCount"] == 1
    finally:
        await mutual.stop()
