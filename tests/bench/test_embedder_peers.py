"""bench.embedder_peers (issue 50): the figures and their ratios, the per-CPU-class merge,
the peers' installer (constraints from the product's versions; a pin that cannot install
becomes a skip record and the other entries go on), the cosine and weight-byte helpers,
and the Infinity layout — all without a model run. One slow test runs the in-process
worker on the tiny bge-m3."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import embedder_peers as peers
from bench.embedder_peers import DWSEARCH, REFERENCE, PeerInstall, PeerUnavailable


def entry(p50: float, wps: float, **extra) -> dict:
    return {"query_p50_ms": p50, "query_p99_ms": p50 * 2, "windows_per_s": wps, **extra}


ENTRIES = {
    REFERENCE: entry(134.0, 4.4),  # the fp32 reference: never "the best peer"
    DWSEARCH: entry(30.0, 11.3),
    "infinity-torch": entry(140.0, 4.0, sparse=False),
    "openvino-int8-nncf": entry(25.0, 9.0),
    "openvino-bf16": entry(60.0, 12.0),
    "infinity-optimum": peers.skipped("pip install failed"),
}


def test_best_peer_and_the_ratios_leave_out_dwsearch_the_reference_and_skipped_peers():
    figures = peers.peer_figures(ENTRIES)
    assert figures["peers_dwsearch_query_p50_ms"] == 30.0
    assert figures["peers_best_peer"] == "openvino-int8-nncf"
    assert figures["peers_best_peer_windows"] == "openvino-bf16"
    assert figures["peers_query_p50_dwsearch_over_best_peer"] == pytest.approx(30.0 / 25.0)
    assert figures["peers_windows_dwsearch_over_best_peer"] == pytest.approx(11.3 / 12.0)


def test_no_peer_measured_gives_nan_ratios_not_an_error():
    figures = peers.peer_figures({DWSEARCH: entry(30.0, 11.0), "infinity-torch": peers.skipped("no")})
    assert figures["peers_best_peer"] == "none measured"
    assert np.isnan(figures["peers_query_p50_dwsearch_over_best_peer"])
    assert np.isnan(figures["peers_windows_dwsearch_over_best_peer"])
    skipped_ours = peers.peer_figures({DWSEARCH: peers.skipped("no"), "openvino-bf16": entry(5.0, 5.0)})
    assert np.isnan(skipped_ours["peers_query_p50_dwsearch_over_best_peer"])


def test_a_cpu_class_replaces_its_own_record_and_keeps_the_others():
    previous = {"x86-vnni": {DWSEARCH: entry(29.0, 12.8)}, "x86-avx2": {"old": 1}}
    merged = peers.merge_by_class(previous, "x86-avx2", {DWSEARCH: entry(40.0, 8.0)})
    assert merged == {"x86-vnni": previous["x86-vnni"], "x86-avx2": {DWSEARCH: entry(40.0, 8.0)}}
    assert previous["x86-avx2"] == {"old": 1}  # not changed in place
    assert peers.merge_by_class(None, "arm64", {}) == {"arm64": {}}
    assert peers.merge_by_class("not a mapping", "arm64", {}) == {"arm64": {}}


def test_assemble_merges_params_with_the_results_file_and_adds_the_limits_figures():
    previous = {
        "peers": {"x86-vnni": {"dwsearch": entry(29.0, 12.8)}},
        "peers_limits": {"x86-vnni": {"memory_copy_gb_s": 20.0}},
    }
    limits = {"memory_copy_gb_s": 28.0, "query_weight_read_floor_ms": 11.0, "clock_mhz": 2445.0}
    figures, params = peers.assemble(ENTRIES, limits, "x86-avx2", previous, {"quick": False})
    assert figures["memory_copy_gb_s"] == 28.0
    assert figures["query_weight_read_floor_ms"] == 11.0
    assert "clock_mhz" not in figures  # a param, not a figure
    assert set(params["peers"]) == {"x86-vnni", "x86-avx2"}
    assert params["peers"]["x86-avx2"]["infinity-optimum"] == {"skipped": "pip install failed"}
    assert params["peers_limits"]["x86-vnni"] == {"memory_copy_gb_s": 20.0}
    assert params["peers_runs"] == {"x86-avx2": {"quick": False}}
    json.dumps(params)  # what report.write stores


def test_limits_figures_divide_as_documented():
    figures = peers.limits_figures(
        copy_gb_s=20.0,
        query_weight_bytes=300_000_000,
        dwsearch_query_p50_ms=30.0,
        parameters=300_000_000,
        tokens_per_window=115.0,
        dwsearch_windows_per_s=12.8,
        cpu_class="x86-vnni",
        mhz=2000.0,
        cores=2,
    )
    assert figures["query_weight_read_floor_ms"] == pytest.approx(15.0)
    assert figures["query_weight_read_floor_fraction"] == pytest.approx(0.5)
    assert figures["windows_int8_tops"] == pytest.approx(2 * 300e6 * 115 * 12.8 / 1e12)
    peak = peers.INT8_OPS_PER_CYCLE["x86-vnni"] * 2000e6 * 2
    assert figures["windows_int8_peak_tops_estimate"] == pytest.approx(peak / 1e12)
    assert figures["windows_int8_peak_fraction"] == pytest.approx(2 * 300e6 * 115 * 12.8 / peak)
    unknown = peers.limits_figures(
        copy_gb_s=20.0,
        query_weight_bytes=1,
        dwsearch_query_p50_ms=1.0,
        parameters=1,
        tokens_per_window=1.0,
        dwsearch_windows_per_s=1.0,
        cpu_class="other",
        mhz=1000.0,
        cores=2,
    )
    assert np.isnan(unknown["windows_int8_peak_fraction"])


def test_encoder_parameters_of_xlmr_large_leave_out_the_embeddings():
    config = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24}
    # Per layer: q, k, v, o (h² + h each), h×i + i, i×h + h, two layer norms (2h each).
    assert peers.encoder_parameters(config) == 24 * 12_596_224 == 302_309_376


def test_constraints_pin_the_product_versions_except_what_the_peer_requires_otherwise():
    install = PeerInstall("p", ("peer==1.0",), unpinned=("NumPy", "sentence_transformers"))
    installed = {
        "torch": "2.13.0+cpu",
        "numpy": "2.4.6",
        "huggingface_hub": "0.36.2",
        "sentence-transformers": "5.7.0",
    }
    assert peers.constraints_text(install, installed) == "huggingface-hub==0.36.2\ntorch==2.13.0+cpu\n"
    assert peers.constraints_text(PeerInstall("q", ()), {}) == ""


def test_product_versions_reads_what_is_installed_here():
    found = peers.product_versions(["numpy", "dwsearch-no-such-distribution"])
    assert found == {"numpy": np.__version__}


def test_every_peer_pins_its_own_versions():
    for install in peers.INSTALLS.values():
        assert install.requirements
        for requirement in install.requirements:
            assert "==" in requirement, requirement


def test_a_pin_that_cannot_install_is_a_skip_reason(tmp_path):
    bogus = PeerInstall("bogus", ("dwsearch-no-such-package==0.0.0",))
    with pytest.raises(PeerUnavailable, match=r"failed: .*dwsearch-no-such-package"):
        peers.ensure_peer(bogus, tmp_path, installed={"numpy": np.__version__}, pip_args=("--no-index",))
    venv = tmp_path / "bogus"
    assert (venv / "constraints.txt").read_text() == f"numpy=={np.__version__}\n"
    pth = next(venv.glob("lib/python*/site-packages/dwsearch-product.pth"))
    assert pth.read_text().splitlines() == peers.product_paths()
    assert not (venv / "dwsearch-peer.json").exists()  # not marked installed: tried again next run


def test_an_installed_peer_is_reused_while_its_pins_hold(tmp_path):
    install = PeerInstall("ready", ("peer==1.0",))
    installed = {"numpy": np.__version__}
    venv = tmp_path / "ready"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    marker = {
        "requirements": ["peer==1.0"],
        "constraints": peers.constraints_text(install, installed),
        "product_paths": peers.product_paths(),
        "check_output": "peer 1.0",  # what its import check printed
    }
    (venv / "dwsearch-peer.json").write_text(json.dumps(marker))
    assert peers.ensure_peer(install, tmp_path, installed=installed) == venv / "bin" / "python"
    # Another pin: installed again (here it fails offline, and says so).
    moved = PeerInstall("ready", ("dwsearch-no-such-package==2.0",))
    with pytest.raises(PeerUnavailable):
        peers.ensure_peer(moved, tmp_path, installed=installed, pip_args=("--no-index",))


def test_a_peer_that_fails_is_recorded_as_skipped_and_the_others_go_on(tmp_path, monkeypatch):
    plan = peers.Plan(
        model_dir=tmp_path,
        model_id="m",
        queries=["q1", "q2"],
        windows=["w1", "w2", "w3"],
        calibration=[],
        query_count=2,
        budget_s=1.0,
        quick=True,
        work=tmp_path,
    )
    reference = {
        "query_latencies_s": [0.1, 0.2],
        "windows_done": 3,
        "windows_elapsed_s": 1.5,
        "query_vectors": np.eye(2, 4),
        "window_vectors": np.eye(3, 4),
    }

    def broken() -> dict:
        raise PeerUnavailable("pip install infinity-emb==0 failed: no such version")

    def fine() -> dict:
        return {**reference, "window_vectors": np.eye(3, 4) + 0.01, "sparse": True}

    monkeypatch.setattr(
        peers,
        "entries_to_run",
        lambda plan: [(REFERENCE, lambda: dict(reference)), ("infinity-torch", broken), (DWSEARCH, fine)],
    )
    entries = peers.run_entries(plan, "x86-avx2")
    assert entries["infinity-torch"]["skipped"] == "pip install infinity-emb==0 failed: no such version"
    ours = entries[DWSEARCH]
    assert ours["query_p50_ms"] == pytest.approx(100.0)  # nearest rank of [0.1, 0.2]
    assert ours["windows_per_s"] == pytest.approx(2.0)
    assert ours["dense_cosine_mean"] < 1.0 < ours["dense_cosine_min"] + 0.01
    assert ours["cpu_class"] == "x86-avx2" and ours["sparse"] is True
    assert entries[REFERENCE]["dense_cosine_min"] == pytest.approx(1.0)


def test_dense_cosines_compare_rows_with_the_references_first_rows():
    reference = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    assert peers.dense_cosines(reference * 3, reference) == pytest.approx([1.0, 1.0, 1.0])
    assert peers.dense_cosines(np.array([[0.0, 1.0]]), reference) == pytest.approx([0.0])
    figures = peers.cosine_figures(reference[:1], reference[1:2] * -1, reference[:1], reference[1:2])
    assert figures == {"dense_cosine_min": pytest.approx(-1.0), "dense_cosine_mean": pytest.approx(0.0)}
    with pytest.raises(ValueError):
        peers.dense_cosines(np.ones((1, 3)), reference)


def test_timing_figures_and_percentile():
    figures = peers.timing_figures([0.03, 0.01, 0.02, 0.5], windows_done=64, windows_elapsed_s=8.0)
    assert figures["query_p50_ms"] == pytest.approx(30.0)  # nearest rank: sorted[round(1.5)]
    assert figures["query_p99_ms"] == pytest.approx(500.0)
    assert figures["windows_per_s"] == 8.0 and figures["windows"] == 64 and figures["queries"] == 4
    assert np.isnan(peers.percentile([], 50))


def test_lexical_weights_keep_the_largest_weight_per_token_without_special_tokens():
    ids = np.array([[0, 5, 7, 5, 2, 1]])
    mask = np.array([[1, 1, 1, 1, 1, 0]])
    weights = np.array([[9.0, 0.2, 0.0, 0.4, 9.0, 9.0]], dtype=np.float32)
    unused = np.array([0, 1, 2, 3])
    assert peers.lexical_weights(ids, mask, weights, unused) == [{5: pytest.approx(0.4)}]


def test_onnx_weight_bytes_leave_out_tables_read_by_gather(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.zeros((100, 8), dtype=np.uint8), "word_table")
    scale = numpy_helper.from_array(np.array(0.1, dtype=np.float32), "scale")
    positions = numpy_helper.from_array(np.zeros((10, 8), dtype=np.float32), "positions")
    weight = numpy_helper.from_array(np.zeros((8, 4), dtype=np.int8), "weight")
    nodes = [
        helper.make_node("DequantizeLinear", ["word_table", "scale"], ["table_f"]),
        helper.make_node("Gather", ["table_f", "ids"], ["words"]),
        helper.make_node("Gather", ["positions", "ids"], ["pos"]),
        helper.make_node("Add", ["words", "pos"], ["x"]),
        helper.make_node("Cast", ["weight"], ["weight_f"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x", "weight_f"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
        [table, scale, positions, weight],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert peers.onnx_weight_bytes(path) == {
        "initializer_bytes": 800 + 4 + 320 + 32,
        "gathered_table_bytes": 800 + 320,
        "per_query_bytes": 4 + 32,
    }


def test_the_infinity_layout_links_the_files_and_adds_cls_pooling(tmp_path):
    model = tmp_path / "bge-m3-like"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"hidden_size": 1024, "max_position_embeddings": 8194, "pad_token_id": 1})
    )
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "onnx").mkdir()  # dwsearch's own exports are not Infinity's to load
    layout = peers.repository_layout(model, tmp_path / "home")
    assert (layout / "model.safetensors").is_symlink()
    assert (layout / "model.safetensors").read_bytes() == b"weights"
    assert not (layout / "onnx").exists()
    pooling = json.loads((layout / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_cls_token"] and not pooling["pooling_mode_mean_tokens"]
    assert pooling["word_embedding_dimension"] == 1024
    assert json.loads((layout / "sentence_bert_config.json").read_text())["max_seq_length"] == 8192
    modules = json.loads((layout / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert peers.repository_layout(model, tmp_path / "home") == layout  # again: reused


def test_pip_error_keeps_the_error_lines():
    output = "Collecting x\nERROR: Could not find a version\nERROR: No matching distribution found for x\n"
    assert (
        peers.pip_error(output)
        == "ERROR: Could not find a version ERROR: No matching distribution found for x"
    )
    assert peers.pip_error("Killed\n") == "Killed"


@pytest.mark.slow
def test_the_torch_worker_embeds_the_tiny_model_normalized(tmp_path):
    from dwsearch_testkit.tiny_models import build_tiny_bge_m3

    model = build_tiny_bge_m3(tmp_path / "tiny")
    job = {
        "kind": "torch",
        "precision": "fp32",
        "model_dir": str(model),
        "queries": ["where is my parcel", "refund please", "voucher expired"],
        "windows": ["a window\nof chat"] * 5,
        "query_count": 4,
        "per_call": 2,
        "budget_s": 60.0,
    }
    result = peers.worker_process(Path(sys.executable), job, tmp_path)
    assert result["query_vectors"].shape == (3, 32)
    assert result["window_vectors"].shape == (5, 32)
    assert np.linalg.norm(result["window_vectors"], axis=1) == pytest.approx(np.ones(5), abs=1e-5)
    assert len(result["query_latencies_s"]) == 4 and result["sparse"] is True
    assert result["start_s"] > 0 and result["peak_rss_mb"] > 0


def test_the_quick_model_is_the_testkits_tiny_bge_m3_at_bge_m3s_token_limit(tmp_path):
    from bench.embedder_peers import build_quick_model

    directory = build_quick_model(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    assert config["hidden_size"] == 32 and config["num_hidden_layers"] == 2
    assert config["max_position_embeddings"] == 8192 + 2
    assert json.loads((directory / "tokenizer_config.json").read_text())["model_max_length"] == 8192
    assert (directory / "sparse_linear.pt").is_file() and (directory / "colbert_linear.pt").is_file()
