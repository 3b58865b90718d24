"""The model-server runtime that `dwsearch embedder` and `dwsearch reranker` share: the
engine's lifecycle and gRPC host (runtime), dynamic batching and its lanes (batching),
admission at the door (admission), model files and devices (modelfiles), CPU threads
(threads), ONNX Runtime: the runtime choice and loading (onnxload), sessions (onnxsession),
exports and their cache (onnxexport) and the int8 quantizer (quantizer), the CPU class and
int8 variant (cpuclass), and the int8 guard with its shipped probe set (quantcheck, probeset)."""
