// The dwsearch console's one script (an ES module, no build). It sends the operator's
// token as a bearer header on every call (no cookies) and writes every text it receives
// with textContent, never as markup: chat is untrusted.

const TOKEN_KEY = "dwsearch-console-token";
const $ = (id) => document.getElementById(id);

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

async function api(call, body) {
  const headers = { "Content-Type": "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const response = await fetch(`/api/${call}`, {
    method: "POST",
    headers,
    body: JSON.stringify(body),
    credentials: "omit",
  });
  const payload = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(payload.error || `HTTP ${response.status}`);
  return payload;
}

function showError(error) {
  const box = $("error");
  box.textContent = error ? String(error.message || error) : "";
  box.hidden = !error;
}

function showBanner(lines) {
  const box = $("banner");
  box.replaceChildren(...lines.map((line) => el("p", {}, line)));
  box.hidden = lines.length === 0;
}

function results(...nodes) {
  $("results").replaceChildren(...nodes);
}

// --- highlights: the API's offsets count code points, as Array.from does (not UTF-16) ---

export function highlighted(text, spans) {
  const points = Array.from(text);
  const out = [];
  let at = 0;
  const sorted = [...(spans || [])]
    .map((s) => ({ start: s.start || 0, end: s.end || 0 }))
    .sort((a, b) => a.start - b.start);
  for (const { start, end } of sorted) {
    if (start < at || end <= start) continue;
    if (start > at) out.push(points.slice(at, start).join(""));
    out.push(el("mark", {}, points.slice(start, end).join("")));
    at = end;
  }
  if (at < points.length) out.push(points.slice(at).join(""));
  return out;
}

// --- degradations ---

const DEGRADATION_TEXT = {
  DEGRADATION_REASON_SEMANTIC_DISABLED: "semantic search is off for this org",
  DEGRADATION_REASON_EMBEDDER_UNAVAILABLE: "the embedder is unavailable: the search fell back to full text",
  DEGRADATION_REASON_EMBEDDER_TIMEOUT: "the embedder timed out: the search fell back to full text",
  DEGRADATION_REASON_RERANKER_UNAVAILABLE: "the reranker is unavailable: results are not reranked",
  DEGRADATION_REASON_RERANKER_TIMEOUT: "the reranker timed out: results are not reranked",
  DEGRADATION_REASON_RERANKER_NOT_CONFIGURED: "no reranker is configured: results are not reranked",
};

function degradationLines(degradations) {
  return (degradations || []).map((d) => {
    const text = DEGRADATION_TEXT[d.reason] || `degraded (${d.reason || "unknown reason"})`;
    return d.detail ? `${text}: ${d.detail}` : text;
  });
}

function table(headers, rows, attrs = {}) {
  return el(
    "table",
    attrs,
    el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((c) => el("td", {}, c))))),
  );
}

const fixed = (value, digits = 4) => Number(value || 0).toFixed(digits);
// A protobuf Duration in JSON ("0.003817s") as milliseconds.
const millis = (duration) => `${(parseFloat(duration || "0") * 1000).toFixed(1)} ms`;

// --- search page ---

function weights(text) {
  const out = {};
  for (const part of text.split(",")) {
    const [leg, value] = part.split("=").map((s) => s.trim());
    if (leg) out[leg] = Number(value);
  }
  return out;
}

function searchHit(hit, index) {
  const legs = (hit.explanation && hit.explanation.legs) || [];
  const explanation = hit.explanation
    ? el(
        "details",
        { class: "explanation" },
        el("summary", {}, `explanation: fused ${fixed(hit.explanation.fused_score)}` +
          (hit.explanation.rerank_score !== undefined && hit.explanation.rerank_score !== null ? `, rerank ${fixed(hit.explanation.rerank_score)}` : "")),
        table(
          ["leg", "rank", "raw score", "normalized", "weight"],
          legs.map((l) => [l.leg, String(l.rank || 0), fixed(l.raw_score), fixed(l.normalized_score), fixed(l.weight, 2)]),
          { class: "legs" },
        ),
      )
    : null;
  const context = (messages, label) =>
    messages && messages.length
      ? el("ol", { class: "context", "aria-label": label }, ...messages.map((m) => el("li", {}, m.text || "")))
      : null;
  return el(
    "article",
    { class: "hit", "data-hit": String(index) },
    el(
      "p",
      { class: "meta" },
      `#${index + 1} · score ${fixed(hit.score)} · ${hit.kind || ""} · ${hit.provider || ""}/${hit.external_channel_id || ""} · ${hit.start_time || ""}`,
    ),
    context(hit.context_before, "before"),
    el("p", { class: "text" }, ...highlighted(hit.text || "", hit.highlights)),
    context(hit.context_after, "after"),
    explanation,
  );
}

async function runSearch(form) {
  const data = new FormData(form);
  const request = {
    org_id: data.get("org"),
    query: data.get("query"),
    mode: data.get("mode"),
    fusion: data.get("fusion"),
    sort: data.get("sort"),
    limit: Number(data.get("limit") || 10),
    context_messages: Number(data.get("context") || 0),
    explain: true,
  };
  const w = weights(String(data.get("weights") || ""));
  if (Object.keys(w).length) request.fusion_weights = w;
  if (data.get("rerank")) request.rerank = data.get("rerank") === "true";
  // datetime-local gives "2026-11-01T09:00" (no zone): read as UTC, as the API's times are.
  if (data.get("start")) request.start_time = `${data.get("start")}:00Z`;
  if (data.get("end")) request.end_time = `${data.get("end")}:00Z`;
  const response = await api("search", request);
  showBanner(degradationLines(response.degradations));
  const stages = (response.stage_times || []).map((s) => [s.stage, millis(s.duration)]);
  const hits = response.hits || [];
  results(
    el(
      "p",
      { class: "summary" },
      `${hits.length} hit(s) · model ${response.model || "none"}${response.reranked ? " · reranked" : ""}`,
    ),
    stages.length ? table(["stage", "time"], stages, { class: "stages" }) : "",
    ...hits.map(searchHit),
  );
}

// --- index page ---

function documents(title, docs) {
  return el(
    "section",
    { class: "documents" },
    el("h3", {}, title),
    docs && docs.length
      ? table(
          ["id", "score", "data", "metadata"],
          docs.map((d) => {
            const doc = d.document || d;
            return [doc.id || "", fixed(d.score), doc.data || "", doc.metadata ? JSON.stringify(doc.metadata) : ""];
          }),
        )
      : el("p", {}, "none"),
  );
}

async function runIndexQuery(form) {
  const data = new FormData(form);
  const request = {
    namespace: data.get("namespace") || "",
    data: data.get("data"),
    mode: data.get("mode"),
    top_k: Number(data.get("top_k") || 10),
    include_data: true,
    include_metadata: true,
  };
  if (data.get("filter")) request.filter = data.get("filter");
  const response = await api("index-query", request);
  showBanner(degradationLines(response.degradations));
  results(documents(`results (${response.mode || ""})`, response.results));
}

async function runAgentContext(form) {
  const data = new FormData(form);
  const namespace = new FormData($("index-form")).get("namespace") || "";
  const response = await api("agent-context", {
    namespace,
    app_id: data.get("app_id"),
    message: data.get("message"),
  });
  showBanner(degradationLines(response.degradations));
  results(
    documents("similar tickets", response.similar_tickets),
    documents("knowledge", response.knowledge),
    documents("good responses", response.good_responses),
  );
}

// --- sweep page ---

async function retry(org, id, button) {
  button.disabled = true;
  try {
    const response = await api("retry-poison", { org_id: org, ids: [id] });
    showError(null);
    showBanner([`released ${response.windows_released || 0} poison window(s)`]);
    await runStatus($("sweep-form"));
  } catch (error) {
    showError(error);
    button.disabled = false;
  }
}

async function runStatus(form) {
  const org = String(new FormData(form).get("org") || "");
  const response = await api("sweep-status", { org_id: org });
  // Whether the org's flags let the sweep embed it, and which are off if not.
  const flags = org ? await api("flags", { org_id: org }) : null;
  const watermarks = response.watermarks || [];
  const poison = response.poison_windows || [];
  const stalled = watermarks.filter((w) => (w.consecutive_failures || 0) > 0);
  const figures = [
    ["model", response.model || ""],
    ["embedded windows", response.embedded_windows || "0"],
    ["backlog (pending events)", response.pending_events || "0"],
    ["unswept events", response.unswept_events || "0"],
    ["unswept lag", response.unswept_lag || "0s"],
    ["max lag", watermarks.reduce((m, w) => Math.max(m, parseFloat(w.lag || "0")), 0).toFixed(1) + "s"],
    ["stalled keys", String(stalled.length)],
    ["poison windows", String(poison.length)],
  ];
  results(
    flags
      ? el("p", { class: flags.swept ? "flags" : "flags off" },
          flags.swept ? `${org}: its flags let the sweep embed it` : `${org} is not swept: ${flags.reason}`)
      : "",
    table(["figure", "value"], figures, { class: "figures" }),
    el("h3", {}, "keys"),
    watermarks.length
      ? table(
          ["key", "model", "pending", "lag", "last run", "failures"],
          watermarks.map((w) => [
            `${w.org_id}/${w.provider}/${w.external_channel_id}`, w.model || "", String(w.pending_events || 0),
            w.lag || "0s", w.updated_at || "", String(w.consecutive_failures || 0),
          ]),
          { class: "keys" },
        )
      : el("p", {}, "none"),
    el("h3", {}, "stalled keys"),
    stalled.length
      ? table(
          ["key", "failures", "last error"],
          stalled.map((w) => [`${w.org_id}/${w.provider}/${w.external_channel_id}`, String(w.consecutive_failures), w.last_error || ""]),
        )
      : el("p", {}, "none"),
    el("h3", {}, "poison windows"),
    poison.length
      ? table(
          ["window", "key", "attempts", "error", ""],
          poison.map((p) => {
            const button = el("button", { type: "button", class: "retry", "data-id": p.id }, "Retry");
            button.addEventListener("click", () => retry(p.org_id, p.id, button));
            return [p.id, `${p.org_id}/${p.provider}/${p.external_channel_id}`, String(p.attempts || 0), p.error || "", button];
          }),
          { class: "poison" },
        )
      : el("p", { class: "no-poison" }, "none"),
  );
}

// --- models page ---

function modelTable(title, info) {
  const rows = Object.entries(info).map(([key, value]) => [key, Array.isArray(value) ? value.join(", ") : String(value)]);
  return el("section", { class: "model" }, el("h3", {}, title), table(["field", "value"], rows));
}

async function runModels() {
  const response = await api("models", {});
  const down = [response.embedder, response.reranker].filter((info) => info.error).map((info) => info.error);
  showBanner(down);
  results(modelTable("embedder", response.embedder), modelTable("reranker", response.reranker));
}

// --- wiring ---

async function loadOrgs() {
  const list = $("orgs");
  if (!list || !token()) return;
  try {
    const { orgs } = await api("orgs", {});
    list.replaceChildren(...orgs.map((org) => el("option", { value: org })));
  } catch (error) {
    showError(error);
  }
}

function submit(id, run) {
  const form = $(id);
  if (!form) return;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    showError(null);
    form.setAttribute("aria-busy", "true");
    try {
      await run(form);
    } catch (error) {
      showError(error);
    } finally {
      form.removeAttribute("aria-busy");
      document.body.dataset.ready = String(Number(document.body.dataset.ready || 0) + 1);
    }
  });
}

function start() {
  const tokenForm = $("token-form");
  const state = $("token-state");
  state.textContent = token() ? "token set" : "no token";
  tokenForm.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    state.textContent = token() ? "token set" : "no token";
    loadOrgs();
  });
  submit("search-form", runSearch);
  submit("index-form", runIndexQuery);
  submit("context-form", runAgentContext);
  submit("sweep-form", runStatus);
  submit("models-form", runModels);
  loadOrgs();
  document.body.dataset.started = "true";
}

start();
