"""The int8 quantizer of an exported float32 graph (dwsearch.modelserver.onnxexport):
ONNX Runtime's dynamic quantization written one tensor at a time, in 8-bit weights or, for
CPUs whose u8×s8 sums saturate, 7-bit ones (dwsearch.modelserver.cpuclass); and the
page-aligned external data file (`model.onnx.data`) it and the export write weights into."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from dwsearch.modelserver.rowquant import RowQuantizer, quantized_matmul_nodes

DATA_FILE = "model.onnx.data"
_PAGE = 4096  # external data offsets aligned, so ONNX Runtime can map them


def initializers(graph: Any) -> Iterator[Any]:
    """Every initializer of the model, subgraphs included."""
    from onnx.external_data_helper import _get_all_tensors

    return iter(_get_all_tensors(graph))


def quantize_int8(fp32: Path, output: Path, *, weight_bits: int = 8) -> None:
    """Dynamic int8 quantization, one tensor at a time, with weights in `weight_bits` bits
    (8, or 7 for CPUs whose u8×s8 sums saturate: dwsearch.modelserver.cpuclass).

    Each MatMul by a constant 2-D weight becomes com.microsoft's MatMulIntegerToFloat
    over the weight in int8, symmetric per output column, and the activation quantized
    per row at run time (dwsearch.modelserver.rowquant: a text's numbers do not depend on
    its batch; ONNX Runtime's own dynamic quantization takes one scale per batch); each Gather from a constant table (the embeddings) reads a uint8
    table, asymmetric per tensor, through DequantizeLinear. That is the graph ONNX Runtime
    runs after fusing what onnxruntime.quantization.quantize_dynamic(per_channel=True,
    weight_type=QInt8) writes, as close to float32 (all-MiniLM-L6-v2 on the support set:
    cosine 0.988 lowest, 0.994 mean, for both) — but quantize_dynamic holds several copies
    of the model, 8.5 GB for bge-m3, over the embedder pods' memory limit, where this holds
    one tensor at a time. Per-tensor weight scales would cost MiniLM a cosine of 0.966 to
    its float32 vectors (tests/embedder/test_onnx_runtime.py checks per-column's)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(fp32), load_external_data=False)
    graph = model.graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    consumers: dict[str, set[tuple[str, int]]] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, set()).add((node.op_type, index))
    external = any(uses_external_data(tensor) for tensor in graph.initializer)

    def read(tensor: Any) -> np.ndarray:
        if not uses_external_data(tensor):
            return numpy_helper.to_array(tensor)
        raw = read_external(tensor, fp32.parent)
        return np.frombuffer(raw, dtype=helper.tensor_dtype_to_np_dtype(tensor.data_type)).reshape(
            tuple(tensor.dims)
        )

    def constant_2d(name: str, op: str, index: int) -> bool:
        tensor = weights.get(name)
        return (
            tensor is not None
            and tensor.data_type == TensorProto.FLOAT
            and len(tensor.dims) == 2
            and consumers[name] == {(op, index)}
        )

    levels = (1 << (weight_bits - 1)) - 1  # 127 or 63: symmetric, zero point 0
    with contextlib.ExitStack() as stack:
        data = stack.enter_context(open(output.parent / DATA_FILE, "wb")) if external else None

        def store(array: np.ndarray, name: str) -> Any:
            if data is None or array.nbytes < 1024:
                return numpy_helper.from_array(array, name)
            tensor = TensorProto(
                name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape
            )
            write_external(tensor, array.tobytes(), data)
            return tensor

        quantized: dict[str, tuple[str, ...]] = {}
        rows = RowQuantizer(model)
        activations: dict[str, tuple[str, str]] = {}  # each activation quantized once
        added: list[Any] = []
        nodes: list[Any] = []
        for node in graph.node:
            if node.op_type == "MatMul" and constant_2d(node.input[1], "MatMul", 1):
                name = node.input[1]
                if name not in quantized:
                    weight = read(weights[name])
                    scale = _scale(np.abs(weight).max(axis=0), levels)
                    added += [
                        store(_to_int8(weight, scale, levels), name + "_int8"),
                        store(scale, name + "_scale"),
                    ]
                    quantized[name] = (name + "_int8", name + "_scale")
                    del weight
                weight_int8, weight_scale = quantized[name]
                nodes += quantized_matmul_nodes(rows, node, weight_int8, weight_scale, activations)
            elif node.op_type == "Gather" and constant_2d(node.input[0], "Gather", 0):
                name = node.input[0]
                if name not in quantized:
                    table = read(weights[name])
                    low, high = min(float(table.min()), 0.0), max(float(table.max()), 0.0)
                    table_scale = np.float32((high - low) / 255 or 1.0)
                    zero_point = np.uint8(round(float(-low / table_scale)))
                    added += [
                        store(_to_uint8(table, table_scale, zero_point), name + "_int8"),
                        store(np.asarray(table_scale), name + "_scale"),
                        store(np.asarray(zero_point), name + "_zero_point"),
                    ]
                    quantized[name] = (name + "_int8", name + "_scale", name + "_zero_point")
                    del table
                gather = onnx.NodeProto()
                gather.CopyFrom(node)
                gather.input[0] = quantized[name][0]
                gather.output[0] = node.output[0] + "_int8"
                nodes += [gather, helper.make_node(
                    "DequantizeLinear", [gather.output[0], *quantized[name][1:]], [node.output[0]],
                    name=node.name + "_dequantize",
                )]  # fmt: skip
            else:
                nodes.append(node)
        used = {name for node in nodes for name in node.input}
        kept = [tensor for tensor in graph.initializer if tensor.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        del graph.node[:]
        graph.node.extend(nodes)
        if data is not None:  # what stays float32 (initializers, Constant nodes) moves to the new file too
            for tensor in initializers(model):
                if uses_external_data(tensor):
                    write_external(tensor, read_external(tensor, fp32.parent), data)
        graph.initializer.extend(added)
        rows.finish()
    onnx.save_model(model, str(output))


def _scale(absmax: np.ndarray, levels: int = 127) -> np.ndarray:
    return np.where(absmax > 0, absmax / levels, 1).astype(np.float32)


def _to_int8(weight: np.ndarray, scale: np.ndarray, levels: int = 127, rows: int = 16384) -> np.ndarray:
    """round(weight / scale) in [-levels, levels], a block of rows at a time (the embedding
    table of bge-m3 is 1 GB in float32)."""
    out = np.empty(weight.shape, dtype=np.int8)
    for start in range(0, weight.shape[0], rows):
        block = weight[start : start + rows] / scale
        out[start : start + rows] = np.clip(np.rint(block), -levels, levels)
    return out


def _to_uint8(table: np.ndarray, scale: np.float32, zero_point: np.uint8, rows: int = 16384) -> np.ndarray:
    """Asymmetric per-tensor uint8 (as quantize_dynamic stores a Gather's table), a block
    of rows at a time."""
    out = np.empty(table.shape, dtype=np.uint8)
    for start in range(0, table.shape[0], rows):
        block = np.rint(table[start : start + rows] / scale) + int(zero_point)
        out[start : start + rows] = np.clip(block, 0, 255)
    return out


def read_external(tensor: Any, directory: Path) -> bytes:
    from onnx.external_data_helper import ExternalDataInfo

    info = ExternalDataInfo(tensor)
    with open(directory / info.location, "rb") as blob:
        blob.seek(info.offset or 0)
        return blob.read(info.length) if info.length else blob.read()


def write_external(tensor: Any, content: bytes, data: Any) -> None:
    """Append `content` to the open data file, page-aligned, and point `tensor` at it."""
    from onnx import TensorProto

    offset = -data.tell() % _PAGE + data.tell()
    data.seek(offset)
    data.write(content)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", DATA_FILE), ("offset", offset), ("length", len(content))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)
