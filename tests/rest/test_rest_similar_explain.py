"""REST's extension fields: `similarTo` (a stored document's own vectors as the query) and
`explain` (each result's sources), which the Upstash SDKs pass through unchanged."""

from __future__ import annotations

import httpx


async def test_rest_similar_to_and_explain_are_extension_fields(rest_url):
    async with httpx.AsyncClient(base_url=rest_url, headers={"Authorization": "Bearer hybrid-token"}) as http:
        await http.post(
            "/upsert",
            json=[
                {"id": "x", "vector": [1, 0], "sparseVector": {"indices": [1], "values": [1]}},
                {"id": "y", "vector": [0.9, 0.2], "sparseVector": {"indices": [1], "values": [0.5]}},
                {"id": "z", "vector": [0, 1], "sparseVector": {"indices": [9], "values": [1]}},
            ],
        )
        r = await http.post("/query", json={"similarTo": "x", "topK": 2, "explain": True})
        assert r.status_code == 200, r.text
        results = r.json()["result"]
        assert [hit["id"] for hit in results] == ["y", "z"]
        legs = results[0]["explanation"]["legs"]
        assert [leg["leg"].split(":")[0] for leg in legs] == ["dense", "sparse"]
        assert [leg["rank"] for leg in legs] == [2, 2]  # behind x itself, a candidate of each source
        plain = (await http.post("/query", json={"similarTo": "x", "topK": 1})).json()["result"]
        assert "explanation" not in plain[0]  # what the SDKs see unless asked
        bad = await http.post("/query", json={"similarTo": "x", "vector": [1, 0]})
        assert bad.status_code == 400 and "similarTo" in bad.json()["error"]
        missing = await http.post("/query", json={"similarTo": "nope"})
        assert missing.status_code == 404
        await http.post("/reset")
