"""Int8 activations quantized per row, so that a text's numbers do not depend on its batch.

Dynamic int8 quantization (ONNX Runtime's DynamicQuantizeLinear and DynamicQuantizeMatMul)
takes one scale and zero point for a whole activation tensor: every input's output depends
on the largest activation of any input in its batch. A text embedded alone and beside
another differed by up to 0.009 per component (cosine 0.9992, the use backend on an AMD
EPYC), so the same query ranked differently under load and a document queried by its own
text did not score 1.

Here each row of an activation (one token's vector: the last axis) gets its own scale,
symmetric about a fixed zero point of 128:

    scale = max(|x| over the row) / 127        (a row of zeros: a tiny scale, all 128)
    q     = floor(x / scale + 128.5)           (round half up, into 1..255, as uint8)

and the integer product is multiplied back by the row's scale and the weight's. A row's
codes depend on that row alone; what then differs between batches is float rounding (a
sum over a padded sequence is blocked differently), 1e-6, as in float32.

`rewrite_dynamic_quantization` turns a graph's DynamicQuantizeLinear nodes (the use
package's shipped graph) into this form; `quantized_matmul_nodes` writes it for the
quantizer's MatMuls (dwsearch.modelserver.quantizer), one quantization per activation
shared by every MatMul that reads it (attention's query, key and value)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

ZERO_POINT = 128
LEVELS = 127  # symmetric: codes 1..255 about 128
_TINY = np.float32(1e-30)  # the scale of a row of zeros (its codes are all 128)


def _opset(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


class RowQuantizer:
    """Writes per-row quantizations into `model`'s main graph: nodes, and the constants
    they share (added once)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.axes_as_input = _opset(model) >= 18  # ReduceMax's axes: an input from opset 18
        self._constants: dict[str, Any] = {}

    def constant(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        if name not in self._constants:
            self._constants[name] = numpy_helper.from_array(value, name)
        return name

    def quantize(self, x: str, prefix: str, *, codes: str, scale: str) -> list[Any]:
        """Nodes that quantize activation `x` per row into `codes` (uint8, zero point 128)
        and `scale` (float, the row's, shaped as `x` with a last axis of 1)."""
        from onnx import TensorProto, helper

        reduce_inputs = [prefix + "_abs"]
        attributes: dict[str, Any] = {"keepdims": 1}
        if self.axes_as_input:
            reduce_inputs.append(self.constant("rowquant_axes", np.array([-1], dtype=np.int64)))
        else:
            attributes["axes"] = [-1]
        inverse_levels = self.constant("rowquant_inverse_levels", np.array(1 / LEVELS, dtype=np.float32))
        tiny = self.constant("rowquant_tiny", np.array(_TINY, dtype=np.float32))
        offset = self.constant("rowquant_offset", np.array(ZERO_POINT + 0.5, dtype=np.float32))
        return [
            helper.make_node("Abs", [x], [prefix + "_abs"], name=prefix + "_abs"),
            helper.make_node(
                "ReduceMax", reduce_inputs, [prefix + "_absmax"], name=prefix + "_absmax", **attributes
            ),
            helper.make_node("Mul", [prefix + "_absmax", inverse_levels], [prefix + "_step"], name=prefix + "_step"),
            helper.make_node("Max", [prefix + "_step", tiny], [scale], name=prefix + "_scale"),
            helper.make_node("Div", [x, scale], [prefix + "_scaled"], name=prefix + "_scaled"),
            # + 128.5 then truncation: round half up into 1..255 (|x / scale| <= 127).
            helper.make_node("Add", [prefix + "_scaled", offset], [prefix + "_shifted"], name=prefix + "_shifted"),
            helper.make_node("Cast", [prefix + "_shifted"], [codes], name=prefix + "_codes", to=TensorProto.UINT8),
        ]  # fmt: skip

    def zero_point(self) -> str:
        return self.constant("rowquant_zero_point", np.array(ZERO_POINT, dtype=np.uint8))

    def finish(self) -> None:
        """Add the shared constants to the graph (once) and the com.microsoft opset."""
        from onnx import helper

        have = {t.name for t in self.model.graph.initializer}
        self.model.graph.initializer.extend(t for n, t in self._constants.items() if n not in have)
        if not any(opset.domain == "com.microsoft" for opset in self.model.opset_import):
            self.model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def quantized_matmul_nodes(
    rows: RowQuantizer, node: Any, weight: str, weight_scale: str, quantized: dict[str, tuple[str, str]]
) -> list[Any]:
    """`node` (MatMul of activation node.input[0] by a constant weight, stored int8,
    symmetric per column with `weight_scale`) as com.microsoft's MatMulIntegerToFloat over
    the activation quantized per row, then the row's scale. The activation's quantization
    is written once (`quantized` remembers it) and shared by its other MatMuls."""
    from onnx import helper

    x = node.input[0]
    nodes = []
    if x not in quantized:
        prefix = f"rowquant_{len(quantized)}"
        quantized[x] = (prefix + "_codes", prefix + "_row_scale")
        nodes += rows.quantize(x, prefix, codes=quantized[x][0], scale=quantized[x][1])
    codes, scale = quantized[x]
    one = rows.constant("rowquant_one", np.array(1.0, dtype=np.float32))
    product = node.name + "_int8_product"
    nodes += [
        helper.make_node(
            "MatMulIntegerToFloat", [codes, weight, one, weight_scale, rows.zero_point()], [product],
            name=node.name + "_int8", domain="com.microsoft",
        ),
        helper.make_node("Mul", [product, scale], list(node.output), name=node.name + "_row_scale"),
    ]  # fmt: skip
    return nodes


def rewrite_dynamic_quantization(model: Any) -> int:
    """Each DynamicQuantizeLinear of `model`'s main graph in the pattern quantize_dynamic
    writes — codes into MatMulInteger (as A), zero point into MatMulInteger (as A's zero
    point), scale into Mul(scale, weight scale) whose product scales Cast(MatMulInteger) by
    another Mul — becomes a per-row quantization. Its scale output becomes 1 and the row's
    scale multiplies that last Mul's output: ONNX Runtime fuses the MatMulInteger, Cast and
    Muls into MatMulIntegerToFloat, which takes a per-tensor scale only (fused with a
    per-row one it computed nonsense: cosine 0.37 to float32). Returns how many were
    rewritten; raises ValueError for one in another pattern (its batch dependence would
    remain)."""
    graph = model.graph
    consumers: dict[str, list[Any]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    rows = RowQuantizer(model)
    one = rows.constant("rowquant_one", np.array(1.0, dtype=np.float32))
    scaled_by: dict[int, str] = {}  # id of a product's last Mul -> the row scale it takes
    nodes: list[Any] = []
    rewritten = 0
    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            if id(node) in scaled_by:
                output = node.output[0]
                node.output[0] = output + "_before_row_scale"
                nodes += [node, _mul(node.output[0], scaled_by[id(node)], output, node.name + "_row_scale")]
            else:
                nodes.append(node)
            continue
        codes, scale, zero_point = node.output
        scale_muls = consumers[scale]
        if not (
            {(n.op_type, list(n.input).index(codes)) for n in consumers[codes]} <= {("MatMulInteger", 0)}
            and {(n.op_type, list(n.input).index(zero_point)) for n in consumers[zero_point]}
            <= {("MatMulInteger", 2)}
            and all(n.op_type == "Mul" for n in scale_muls)
            and all(c.op_type == "Mul" for n in scale_muls for c in consumers[n.output[0]])
        ):
            raise ValueError(f"{node.name}: its outputs do not feed only quantized MatMuls")
        prefix = f"rowquant_dql_{rewritten}"
        nodes += rows.quantize(node.input[0], prefix, codes=codes, scale=prefix + "_row_scale")
        nodes += [
            _identity(rows.zero_point(), zero_point, prefix + "_zero_point"),
            _identity(one, scale, prefix + "_unit_scale"),
        ]
        for mul in scale_muls:
            for product in consumers[mul.output[0]]:
                scaled_by[id(product)] = prefix + "_row_scale"
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    rows.finish()
    return rewritten


def _identity(source: str, output: str, name: str) -> Any:
    from onnx import helper

    return helper.make_node("Identity", [source], [output], name=name)


def _mul(a: str, b: str, output: str, name: str) -> Any:
    from onnx import helper

    return helper.make_node("Mul", [a, b], [output], name=name)
