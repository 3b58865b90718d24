"""docs/support-index.md's Python buildAgentContext, run as written against a HYBRID index with
server-side embedding."""

from __future__ import annotations

import asyncio

import pytest
from upstash_vector import AsyncIndex
from upstash_vector.types import Data

pytestmark = pytest.mark.timeout(60)


async def test_readme_build_agent_context(embedded_url):
    index = AsyncIndex(url=embedded_url + "/hybrid-model", token="hybrid-model-token", retries=0)

    async def build_agent_context(app_id: str, message: str) -> dict:
        app = app_id.replace("'", "''")
        tickets, knowledge, responses = await asyncio.gather(
            index.query(data=message, top_k=3, include_metadata=True, include_data=True,
                        filter=f"appId = '{app}' AND type = 'conversation' AND resolution != 'escalated'"),
            index.query(data=message, top_k=5, include_metadata=True, include_data=True,
                        filter=f"appId = '{app}' AND type = 'knowledge'"),
            index.query(data=message, top_k=3, include_metadata=True, include_data=True,
                        filter=f"appId = '{app}' AND type = 'response' AND trustScore > 0.85"),
        )  # fmt: skip
        return {"similarTickets": tickets, "knowledge": knowledge, "goodResponses": responses}

    await index.upsert(vectors=[
        Data(id="c1", data="refund for a broken phone", metadata={"appId": "a1", "type": "conversation", "resolution": "refund"}),
        Data(id="c2", data="angry customer wanted a manager", metadata={"appId": "a1", "type": "conversation", "resolution": "escalated"}),
        Data(id="c3", data="refund in another app", metadata={"appId": "a2", "type": "conversation", "resolution": "refund"}),
        Data(id="k1", data="refund policy: 30 days", metadata={"appId": "a1", "type": "knowledge"}),
        Data(id="r1", data="I've issued your refund", metadata={"appId": "a1", "type": "response", "trustScore": 0.9}),
        Data(id="r2", data="please wait", metadata={"appId": "a1", "type": "response", "trustScore": 0.5}),
    ])  # fmt: skip
    context = await build_agent_context("a1", "my phone is broken, I want a refund")
    assert [h.id for h in context["similarTickets"]] == ["c1"]
    assert [h.id for h in context["knowledge"]] == ["k1"]
    assert [h.id for h in context["goodResponses"]] == ["r1"] and context["goodResponses"][0].data
