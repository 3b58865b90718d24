// The official @upstash/vector SDK (pinned in package.json) against a real
// `dwsearch serve --rest-port`, over every endpoint, index type and metric. Run by
// tests/rest/test_rest_typescript_sdk.py, which starts serve with these indexes:
// dense (COSINE, 2-d), dot (DOT_PRODUCT, 3-d), euclid (EUCLIDEAN, 2-d), sparse, hybrid (2-d),
// docs (data embedded by the served model), each with token "t-<name>".
import assert from "node:assert/strict";
import { describe, test, beforeEach } from "node:test";
import { FusionAlgorithm, Index, QueryMode, WeightingStrategy } from "@upstash/vector";

const base = process.env.DWS_REST;
assert.ok(base, "DWS_REST: the REST port's base URL");
const index = (name) => new Index({ url: `${base}/${name}`, token: `t-${name}`, retry: false });
const dense = index("dense");
const dot = index("dot");
const euclid = index("euclid");
const sparse = index("sparse");
const hybrid = index("hybrid");
const docs = index("docs");

beforeEach(async () => {
  await Promise.all([dense, dot, euclid, sparse, hybrid, docs].map((ix) => ix.reset({ all: true })));
});

describe("dense COSINE", () => {
  test("vectors round-trip as sent; metadata absent when absent; identical vectors score 1", async () => {
    assert.equal(await dense.upsert([
      { id: "a", vector: [0.1, 0.2] },
      { id: "b", vector: [0.3, 0.4], metadata: { k: "v" } },
    ]), "Success");
    const [a, b, missing] = await dense.fetch(["a", "b", "zz"], { includeVectors: true, includeMetadata: true });
    assert.deepEqual(a, { id: "a", vector: [0.1, 0.2] });
    assert.deepEqual(b, { id: "b", vector: [0.3, 0.4], metadata: { k: "v" } });
    assert.equal(missing, null);
    const hits = await dense.query({ vector: [0.1, 0.2], topK: 2, includeVectors: true });
    assert.deepEqual(hits[0], { id: "a", score: 1, vector: [0.1, 0.2] });
    assert.ok(hits[1].score < 1 && hits[1].score > 0.9);
  });

  test("numeric ids come back as strings; a filter narrows the query", async () => {
    await dense.upsert([
      { id: 1, vector: [1, 0], metadata: { animal: "tiger", tags: ["mammal"] } },
      { id: 2, vector: [0.9, 0.1], metadata: { animal: "eagle", tags: ["bird"] } },
    ]);
    const hits = await dense.query({ vector: [1, 0], topK: 5, includeMetadata: true, filter: "tags CONTAINS 'bird'" });
    assert.deepEqual(hits.map((h) => h.id), ["2"]);
    assert.deepEqual(hits[0].metadata, { animal: "eagle", tags: ["bird"] });
  });

  test("update patches metadata or replaces the vector; a missing id updates nothing", async () => {
    await dense.upsert({ id: "u", vector: [0.6, 0.8], metadata: { a: 1 } });
    assert.deepEqual(await dense.update({ id: "u", metadata: { b: 2 }, metadataUpdateMode: "PATCH" }), { updated: 1 });
    assert.deepEqual(await dense.update({ id: "u", vector: [0.8, 0.6] }), { updated: 1 });
    assert.deepEqual(await dense.update({ id: "nope", metadata: { b: 2 } }), { updated: 0 });
    const [u] = await dense.fetch(["u"], { includeVectors: true, includeMetadata: true });
    assert.deepEqual(u, { id: "u", vector: [0.8, 0.6], metadata: { a: 1, b: 2 } });
  });

  test("range pages in insertion order from cursor 0 to an empty cursor, by prefix too", async () => {
    const ids = Array.from({ length: 12 }, (_, i) => `id-${i}`);
    await dense.upsert(ids.map((id, i) => ({ id, vector: [1, i + 1] })));
    const seen = [];
    let page = await dense.range({ cursor: 0, limit: 5 });
    seen.push(...page.vectors.map((v) => v.id));
    while (page.nextCursor !== "") {
      page = await dense.range({ cursor: page.nextCursor, limit: 5 });
      seen.push(...page.vectors.map((v) => v.id));
    }
    assert.deepEqual(seen, ids);
    const prefixed = await dense.range({ cursor: "", limit: 10, prefix: "id-1" });
    assert.deepEqual(prefixed.vectors.map((v) => v.id), ["id-1", "id-10", "id-11"]);
  });

  test("delete by ids, prefix and filter; a delete sent before the upsert's answer still wins", async () => {
    await dense.upsert(["x1", "x2", "y1", "z1"].map((id, i) => ({ id, vector: [1, i], metadata: { n: i } })));
    assert.deepEqual(await dense.delete(["x1", "gone"]), { deleted: 1 });
    assert.deepEqual(await dense.delete({ prefix: "x" }), { deleted: 1 });
    assert.deepEqual(await dense.delete({ filter: "n >= 3" }), { deleted: 1 });
    const pending = dense.upsert({ id: "late", vector: [0.5, 0.5] }); // not awaited, as apps do
    await dense.info();
    assert.deepEqual(await dense.delete("late"), { deleted: 1 });
    await pending;
    assert.equal((await dense.info()).vectorCount, 1);
    await assert.rejects(dense.fetch({ ids: ["y1"], prefix: "y" }), /Only one of ids or prefix must be provided/);
  });

  test("namespaces: info lists them, an emptied one stays at 0 until deleted", async () => {
    const ns = dense.namespace("tenant-a");
    await ns.upsert({ id: "n1", vector: [0.2, 0.1] });
    assert.deepEqual((await ns.fetch(["n1"]))[0], { id: "n1" });
    assert.equal((await dense.fetch(["n1"]))[0], null);
    let info = await dense.info();
    assert.equal(info.dimension, 2);
    assert.equal(info.similarityFunction, "COSINE");
    assert.equal(info.namespaces["tenant-a"].vectorCount, 1);
    await ns.reset();
    info = await dense.info();
    assert.equal(info.namespaces["tenant-a"].vectorCount, 0);
    assert.ok((await dense.listNamespaces()).includes("tenant-a"));
    await dense.deleteNamespace("tenant-a");
    assert.ok(!(await dense.listNamespaces()).includes("tenant-a"));
  });

  test("a resumable query pages through the results, then stops", async () => {
    await dense.upsert(Array.from({ length: 6 }, (_, i) => ({ id: `r${i}`, vector: [1, i / 10] })));
    const { result, fetchNext, stop } = await dense.resumableQuery({ vector: [1, 0], topK: 2, maxIdle: 60 });
    assert.deepEqual(result.map((h) => h.id), ["r0", "r1"]);
    assert.deepEqual((await fetchNext(3)).map((h) => h.id), ["r2", "r3", "r4"]);
    await stop();
    await assert.rejects(async () => fetchNext(1), /stopped/);
  });

  test("errors the SDK throws: a wrong dimension, a wrong token", async () => {
    await assert.rejects(dense.upsert({ id: "bad", vector: [1, 2, 3] }), /dimension/i);
    const stranger = new Index({ url: `${base}/dense`, token: "not-a-token", retry: false });
    await assert.rejects(stranger.info(), /unauthori[sz]ed|token/i);
  });
});

describe("DOT_PRODUCT and EUCLIDEAN", () => {
  test("DOT_PRODUCT scores (1 + dot) / 2 from the vector as sent", async () => {
    await dot.upsert({ id: "d", vector: [0.2, 0.4, 0.4] });
    const [hit] = await dot.query({ vector: [0.2, 0.4, 0.4], topK: 1, includeVectors: true });
    assert.equal(hit.id, "d");
    assert.ok(Math.abs(hit.score - (1 + 0.36) / 2) < 1e-6, `${hit.score}`);
    assert.deepEqual(hit.vector, [0.2, 0.4, 0.4]);
  });

  test("EUCLIDEAN scores 1 / (1 + squared distance); identical vectors score exactly 1", async () => {
    await euclid.upsert([{ id: "e0", vector: [1, 1] }, { id: "e1", vector: [2, 3] }]);
    const hits = await euclid.query({ vector: [1, 1], topK: 2 });
    assert.deepEqual(hits.map((h) => h.id), ["e0", "e1"]);
    assert.equal(hits[0].score, 1);
    assert.ok(Math.abs(hits[1].score - 1 / (1 + 5)) < 1e-6, `${hits[1].score}`);
    assert.equal((await euclid.info()).similarityFunction, "EUCLIDEAN");
  });
});

describe("SPARSE and HYBRID", () => {
  test("sparse vectors round-trip in shortest float32 form; duplicate indices are summed", async () => {
    await sparse.upsert([
      { id: "s0", sparseVector: { indices: [0, 1], values: [0.1, 0.2] } },
      { id: "s1", sparseVector: { indices: [1, 2], values: [0.2, 0.3] }, metadata: { key: "value" } },
    ]);
    const hits = await sparse.query({ sparseVector: { indices: [1], values: [0.6] }, topK: 2, includeVectors: true });
    assert.deepEqual(hits.map((h) => h.id).sort(), ["s0", "s1"]);
    const s0 = hits.find((h) => h.id === "s0");
    assert.deepEqual(s0.sparseVector, { indices: [0, 1], values: [0.1, 0.2] });
    assert.equal(s0.score, 0.120000005); // 0.2 × 0.6 in float32, written in its shortest form
    await sparse.upsert({ id: "dup", sparseVector: { indices: [5, 5], values: [0.25, 0.5] } });
    const [dup] = await sparse.fetch(["dup"], { includeVectors: true });
    assert.deepEqual(dup.sparseVector, { indices: [5], values: [0.75] });
  });

  test("hybrid queries fuse with RRF (ranks from 0) and DBSF; queryMode and sparse-only queryMany", async () => {
    await hybrid.upsert([
      { id: "h0", vector: [0.1, 0.2], sparseVector: { indices: [0, 1], values: [0.1, 0.2] } },
      { id: "h1", vector: [0.2, 0.3], sparseVector: { indices: [1, 2], values: [0.2, 0.3] }, metadata: { key: "value" } },
      { id: "h2", vector: [0.3, 0.4], sparseVector: { indices: [2, 3], values: [0.3, 0.4] } },
    ]);
    const [rrf] = await hybrid.query({
      vector: [0.3, 0.4], sparseVector: { indices: [3], values: [1] }, topK: 1, fusionAlgorithm: FusionAlgorithm.RRF,
    });
    assert.deepEqual(rrf, { id: "h2", score: 0.033333335 });
    const dbsf = await hybrid.query({
      vector: [0.3, 0.4], sparseVector: { indices: [3], values: [1] }, topK: 3, fusionAlgorithm: FusionAlgorithm.DBSF,
    });
    assert.equal(dbsf[0].id, "h2");
    const denseOnly = await hybrid.query({
      vector: [0.1, 0.2], sparseVector: { indices: [3], values: [1] }, topK: 1, queryMode: QueryMode.DENSE,
    });
    assert.deepEqual(denseOnly, [{ id: "h0", score: 1 }]);
    const [[sparseOnly]] = await hybrid.queryMany([
      { sparseVector: { indices: [3], values: [1] }, topK: 1, weightingStrategy: WeightingStrategy.IDF, includeMetadata: true },
    ]);
    assert.equal(sparseOnly.id, "h2");
    await assert.rejects(hybrid.upsert({ id: "no-sparse", vector: [1, 1] }), /sparse/i);
  });
});

describe("data embedded by the served model", () => {
  test("upsert data, query data, update data; data returned only when asked", async () => {
    await docs.upsert([
      { id: "k1", data: "reset your password from the login page", metadata: { kind: "article" } },
      { id: "k2", data: "refunds take five working days" },
    ]);
    const [top] = await docs.query({ data: "refunds take five working days", topK: 1, includeData: true });
    assert.equal(top.id, "k2");
    assert.equal(top.data, "refunds take five working days");
    assert.ok(top.score > 0.999, `${top.score}`);
    const [plain] = await docs.query({ data: "refunds take five working days", topK: 1 });
    assert.equal(plain.data, undefined);
    assert.deepEqual(await docs.update({ id: "k1", data: "change your password in settings" }), { updated: 1 });
    const [k1] = await docs.fetch(["k1"], { includeData: true, includeMetadata: true });
    assert.deepEqual(k1, { id: "k1", data: "change your password in settings", metadata: { kind: "article" } });
    await assert.rejects(docs.upsert([{ id: "mixed", data: "x" }, { id: "v", vector: [1, 2] }]));
  });
});
