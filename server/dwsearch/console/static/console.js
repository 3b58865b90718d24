// The dwsearch console's one script (an ES module, no build). It sends the operator's
// token as a bearer header on every call (no cookies) and writes every text it receives
// with textContent, never as markup: chat is untrusted. Its plots are SVG it draws itself
// (no library, nothing from another origin: the page's CSP allows neither).
//
// Every page loads its data as it opens and again every REFRESH_MS while it is visible
// (not while a load is under way, nor while the keyboard is in its results); a page asks
// for nothing its token's scope may not read (/api/auth says the scope). A newer load of
// a page's results cancels the one before (AbortController): a stale answer is never drawn.

const TOKEN_KEY = "dwsearch-console-token";
const REFRESH_MS = 10000;
const TYPING_MS = 250; // search as you type: the pause that sends the query
const SVG = "http://www.w3.org/2000/svg";
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
    if (child === null || child === undefined || child === "") continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

// The trace each answer was made in (the Dwsearch-Trace-Id header, when serve traces).
const traceIds = new WeakMap();

async function api(call, body, signal) {
  const headers = { "Content-Type": "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const response = await fetch(`/api/${call}`, {
    method: "POST",
    headers,
    body: JSON.stringify(body),
    credentials: "omit",
    signal,
  });
  const payload = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (signal) signal.throwIfAborted();
  if (!response.ok) throw new Error(payload.error || `HTTP ${response.status}`);
  const traceId = response.headers.get("Dwsearch-Trace-Id");
  if (traceId && payload && typeof payload === "object") traceIds.set(payload, traceId);
  return payload;
}

const aborted = (error) => error && error.name === "AbortError";

// Who showed the error: a page's own load clears only its own (never a form's).
let errorOwner = null;

function showError(error, owner = null) {
  errorOwner = error ? owner : null;
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

// --- the token and its scope ---

const SCOPES = ["search", "index", "admin"];
let auth = { required: true, scope: null };
let authAsked = 0;

// The token's scope, asked again; false when a later ask (a new token) superseded this one.
async function readAuth() {
  const asked = ++authAsked;
  let answer;
  try {
    answer = await api("auth", {});
  } catch (error) {
    answer = { required: true, scope: null };
  }
  if (asked !== authAsked) return false;
  auth = answer;
  const state = $("token-state");
  if (!auth.required) state.textContent = token() ? "token set: not needed" : "no token needed";
  else if (!token()) state.textContent = "no token";
  else state.textContent = auth.scope ? `token set: ${auth.scope} scope` : "token set: not valid";
  return true;
}

// Whether the token may read what needs `scope`; if not, the line that says why.
function lacks(scope) {
  if (!auth.required) return "";
  if (!token()) return "Enter a bearer token to load this page.";
  if (!auth.scope) return "The token is not one of serve's: enter another.";
  if (SCOPES.indexOf(auth.scope) < SCOPES.indexOf(scope)) return `This needs a token of the ${scope} scope.`;
  return "";
}

// --- loads: one at a time per area, the newest wins ---

class Loader {
  constructor(scope, load) {
    this.scope = scope;
    this.load = load; // async (signal, ...args) => draws
    this.controller = null;
    this.args = [];
  }

  get busy() {
    return this.controller !== null;
  }

  // Run the load (cancelling any under way); resolves once drawn, or at once when superseded.
  async run(...args) {
    if (this.controller) this.controller.abort();
    const controller = new AbortController();
    this.controller = controller;
    this.args = args;
    try {
      await this.load(controller.signal, ...args);
    } catch (error) {
      if (!aborted(error)) throw error;
    } finally {
      if (this.controller === controller) this.controller = null;
    }
  }

  // The page's own loads (opening, the timer, a new token): only when idle and allowed.
  async refresh(...args) {
    if (this.busy) return;
    const why = lacks(this.scope);
    if (why) {
      this.denied(why);
      return;
    }
    // A page's own redraw is not announced (a screen reader would hear it every REFRESH_MS).
    const box = $("results");
    if (!("live" in box.dataset)) box.dataset.live = box.getAttribute("aria-live") || "";
    const live = box.dataset.live;
    box.setAttribute("aria-live", "off");
    try {
      await this.run(...(args.length ? args : this.args));
      if (errorOwner === this) showError(null);
    } catch (error) {
      showError(error, this);
    } finally {
      setTimeout(() => (live ? box.setAttribute("aria-live", live) : box.removeAttribute("aria-live")), 0);
    }
  }

  denied(why) {
    results(el("p", { class: "needs" }, why));
  }
}

const loaders = []; // the page's, refreshed together

function keyboardInResults() {
  const active = document.activeElement;
  return Boolean(active && $("results") && $("results").contains(active) && active !== document.body);
}

function refreshAll() {
  if (document.hidden || keyboardInResults()) return;
  for (const [loader, args] of loaders) loader.refresh(...(loader.args.length ? loader.args : args()));
}

// --- formatting ---

const fixed = (value, digits = 4) => Number(value || 0).toFixed(digits);
// A protobuf Duration in JSON ("0.003817s") as milliseconds.
const millis = (duration) => `${(parseFloat(duration || "0") * 1000).toFixed(1)} ms`;
const count = (n) => Number(n || 0).toLocaleString("en");

function ago(seconds) {
  const s = Math.max(0, Number(seconds || 0));
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

// "2026-11-01T09:00:00Z" → "2026-11-01 09:00 UTC"
function when(timestamp) {
  if (!timestamp) return "";
  return `${String(timestamp).slice(0, 16).replace("T", " ")} UTC`;
}

function clock(unixSeconds) {
  return new Date(unixSeconds * 1000).toISOString().slice(11, 16);
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
// The history's reasons (the metric's labels), as the legend names them.
const REASON_TEXT = {
  semantic_disabled: "semantic search off",
  embedder_unavailable: "embedder unavailable",
  embedder_timeout: "embedder timed out",
  reranker_unavailable: "reranker unavailable",
  reranker_timeout: "reranker timed out",
  reranker_not_configured: "no reranker",
  sparse_unsupported: "sparse unsupported",
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

// A table that scrolls sideways inside its own box on a narrow screen (never the page).
const scrolling = (node, label) => el("div", { class: "scroll", role: "region", "aria-label": label, tabindex: "0" }, node);

// --- plots (SVG) ---

const SERIES_CLASSES = ["s0", "s1", "s2", "s3", "s4", "s5"];

// A line chart of `series` ({name, values}) over `times` (Unix seconds); null values are gaps.
function lineChart({ title, times, series, unit = "", digits = 0 }) {
  const width = 320;
  const height = 120;
  const left = 50;
  const bottom = 18;
  const top = 8;
  const all = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined);
  const max = Math.max(1, ...all);
  const n = times.length;
  const x = (i) => left + (n <= 1 ? (width - left) / 2 : (i * (width - left - 4)) / (n - 1));
  const y = (v) => top + (height - top - bottom) * (1 - v / max);
  const format = (v) => `${Number(v).toFixed(digits)}${unit}`;
  const latest = series.map((s) => {
    const last = [...s.values].reverse().find((v) => v !== null && v !== undefined);
    return `${s.name} ${last === undefined ? "none" : format(last)}`;
  });
  const span = n ? `${clock(times[0])}–${clock(times[n - 1])} UTC` : "no points yet";
  const label = `${title}, ${span}: latest ${latest.join(", ")}`;
  const lines = series.map((s, k) => {
    let d = "";
    let pen = false;
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) {
        pen = false;
        return;
      }
      d += `${pen ? "L" : "M"}${x(i).toFixed(1)} ${y(v).toFixed(1)} `;
      pen = true;
    });
    const one = s.values.filter((v) => v !== null && v !== undefined).length === 1;
    const cls = `line ${SERIES_CLASSES[k % SERIES_CLASSES.length]}`;
    if (one) {
      const i = s.values.findIndex((v) => v !== null && v !== undefined);
      return svg("circle", { class: cls, cx: x(i).toFixed(1), cy: y(s.values[i]).toFixed(1), r: 2.5 });
    }
    return d ? svg("path", { class: cls, d: d.trim() }) : null;
  });
  const chart = svg(
    "svg",
    { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": label },
    svg("title", {}, label),
    svg("line", { class: "axis", x1: left, y1: height - bottom, x2: width, y2: height - bottom }),
    svg("line", { class: "grid", x1: left, y1: top, x2: width, y2: top }),
    svg("text", { class: "tick", x: left - 4, y: top + 4, "text-anchor": "end" }, format(max)),
    svg("text", { class: "tick", x: left - 4, y: height - bottom, "text-anchor": "end" }, format(0)),
    n ? svg("text", { class: "tick", x: left, y: height - 4 }, clock(times[0])) : null,
    n > 1 ? svg("text", { class: "tick", x: width, y: height - 4, "text-anchor": "end" }, clock(times[n - 1])) : null,
    ...lines,
  );
  const legend = el(
    "ul",
    { class: "legend" },
    ...series.map((s, k) =>
      el("li", {}, el("span", { class: `swatch ${SERIES_CLASSES[k % SERIES_CLASSES.length]}`, "aria-hidden": "true" }), latest[k]),
    ),
  );
  return el("figure", { class: "plot" }, el("figcaption", {}, title), chart, legend);
}

// Bars, one per item ({name, value}), against `max`: each leg's part of a fused score.
function barChart(label, items, max, digits = 4) {
  const width = 400;
  const row = 18;
  const nameWidth = 160;
  const height = row * items.length + 4;
  const scale = max > 0 ? (width - nameWidth - 56) / max : 0;
  const chart = svg(
    "svg",
    { viewBox: `0 0 ${width} ${height}`, class: "bars", role: "img", "aria-label": label },
    svg("title", {}, label),
    ...items.flatMap((item, i) => {
      const w = Math.max(0, item.value * scale);
      return [
        svg("text", { class: "tick", x: 0, y: i * row + 13 }, item.name.length > 26 ? `${item.name.slice(0, 25)}…` : item.name),
        svg("rect", { class: `bar ${SERIES_CLASSES[i % SERIES_CLASSES.length]}`, x: nameWidth, y: i * row + 3, width: w.toFixed(1), height: row - 6 }),
        svg("text", { class: "tick", x: nameWidth + w + 4, y: i * row + 13 }, Number(item.value).toFixed(digits)),
      ];
    }),
  );
  return chart;
}

// A share (0..1) as a small bar and its percentage.
function shareBar(share) {
  if (share === null || share === undefined) return el("span", {}, "no chat");
  const pct = Math.round(share * 1000) / 10;
  return el(
    "span",
    { class: "share" },
    svg(
      "svg",
      { viewBox: "0 0 100 8", class: "sharebar", "aria-hidden": "true", focusable: "false" },
      svg("rect", { class: "track", x: 0, y: 0, width: 100, height: 8 }),
      svg("rect", { class: "fill", x: 0, y: 0, width: Math.min(100, pct).toFixed(1), height: 8 }),
    ),
    `${pct}%`,
  );
}

// --- overview page ---

function sumValues(map) {
  return Object.values(map || {}).reduce((a, b) => a + b, 0);
}

function healthCard(name, state, line) {
  return el("div", { class: `card ${state}` }, el("h3", {}, name), el("p", { class: "state" }, state === "ok" ? "healthy" : state === "warn" ? "attention" : "no data"), el("p", {}, line));
}

function drawHealth(history) {
  const points = [...history.points, history.current];
  const recent = points.slice(-31); // about the last five minutes
  const searches = recent.reduce((a, p) => a + p.searches, 0);
  const degraded = recent.reduce((a, p) => a + sumValues(p.degraded), 0);
  const p99s = recent.map((p) => p.search_p99_ms).filter((v) => v !== null);
  const p99 = p99s.length ? Math.max(...p99s) : null;
  const last = points[points.length - 1];
  const known = [...points].reverse().find((p) => p.embedder_up !== null);
  const runs = points.reduce((acc, p) => {
    for (const [code, n] of Object.entries(p.sweep_runs)) acc[code] = (acc[code] || 0) + n;
    return acc;
  }, {});
  const failedRuns = sumValues(runs) - (runs.OK || 0);
  const poisoned = points.reduce((a, p) => a + (p.sweep_windows.poisoned || 0), 0);
  $("health").replaceChildren(
    healthCard(
      "Search",
      searches === 0 ? "none" : degraded > 0 ? "warn" : "ok",
      searches === 0
        ? "no searches in the last 5 min"
        : `${count(searches)} search${searches === 1 ? "" : "es"} in 5 min, p99 ${p99 === null ? "–" : `${p99.toFixed(1)} ms`}, ${count(degraded)} degraded`,
    ),
    healthCard(
      "Embedder",
      !known ? "none" : known.embedder_up ? "ok" : "warn",
      !known
        ? "not asked yet"
        : known.embedder_up
          ? `up; queued ${count(last.queued_interactive ?? known.queued_interactive)} interactive, ${count(last.queued_bulk ?? known.queued_bulk)} bulk`
          : "down: searches fall back to full text",
    ),
    healthCard(
      "Sweep",
      sumValues(runs) === 0 ? "none" : failedRuns > 0 || poisoned > 0 ? "warn" : "ok",
      sumValues(runs) === 0
        ? "no sweep in the last hour"
        : `${count(sumValues(runs))} run(s) in the last hour, ${count(failedRuns)} failed; ${count(poisoned)} window(s) poisoned`,
    ),
  );
}

function drawCharts(history) {
  const points = [...history.points, history.current];
  const times = points.map((p) => p.time);
  const reasons = [...new Set(points.flatMap((p) => Object.keys(p.degraded)))].sort();
  const outcomes = ["embedded", "skipped", "poisoned"];
  const codes = [...new Set(points.flatMap((p) => Object.keys(p.sweep_runs)))].sort();
  $("charts").replaceChildren(
    lineChart({
      title: "Search latency (ms)",
      times,
      series: [
        { name: "p50", values: points.map((p) => p.search_p50_ms) },
        { name: "p99", values: points.map((p) => p.search_p99_ms) },
      ],
      unit: " ms",
      digits: 1,
    }),
    lineChart({
      title: "Searches and degraded searches, by reason",
      times,
      series: [
        { name: "searches", values: points.map((p) => p.searches) },
        ...reasons.map((r) => ({ name: REASON_TEXT[r] || r, values: points.map((p) => p.degraded[r] || 0) })),
      ],
    }),
    lineChart({
      title: "Embedder queue (inputs waiting)",
      times,
      series: [
        { name: "interactive", values: points.map((p) => p.queued_interactive) },
        { name: "bulk", values: points.map((p) => p.queued_bulk) },
      ],
    }),
    lineChart({
      title: "Sweep: runs finished and windows, by outcome",
      times,
      series: [
        ...(codes.length ? codes : ["OK"]).map((c) => ({
          name: c === "OK" ? "runs ok" : `runs ${c.toLowerCase()}`,
          values: points.map((p) => p.sweep_runs[c] || 0),
        })),
        ...outcomes.map((o) => ({ name: `windows ${o}`, values: points.map((p) => p.sweep_windows[o] || 0) })),
      ],
    }),
    lineChart({
      title: "Sweep backlog (events pending at the last sweep's start)",
      times,
      series: [{ name: "pending", values: points.map((p) => p.sweep_pending) }],
    }),
  );
}

async function loadHistory(signal) {
  const history = await api("overview", {}, signal);
  drawHealth(history);
  drawCharts(history);
  document.body.dataset.overview = String(Number(document.body.dataset.overview || 0) + 1);
}

// The org table's pages: the `after` of each page shown so far (keyset paging).
const orgPages = { query: "", afters: [""], next: null };

function orgRow(org) {
  const link = (page, text) => el("a", { href: `/${page}?org=${encodeURIComponent(org.org_id)}` }, text);
  return [
    link("sweep", org.org_id),
    org.semantic_search ? "on" : "off",
    count(org.windows_embedded),
    org.semantic_search ? shareBar(org.searchable_share) : "not swept",
    count(org.pending_events),
    org.lag_s === null ? "–" : ago(org.lag_s),
    count(org.stalled_keys),
    count(org.poison_windows),
    org.knowledge_gaps ? link("gaps", count(org.knowledge_gaps)) : "0",
  ];
}

async function loadOrgFigures(signal, query, after) {
  const response = await api("org-figures", { query, after, limit: 20 }, signal);
  const orgs = response.orgs || [];
  orgPages.next = response.next_after;
  if ($("orgs-next")) {
    // The Overview's pager; the Sweep page shows the first page, each org a link.
    $("orgs-next").disabled = !response.next_after;
    $("orgs-prev").disabled = orgPages.afters.length <= 1;
  }
  const page = orgPages.afters.length;
  results(
    el("p", { class: "summary" }, orgs.length ? `page ${page}: ${orgs.length} org(s)${query ? ` holding “${query}”` : ""}, model ${response.model || "–"}` : query ? `no org holds “${query}”` : "no org has chat yet"),
    orgs.length
      ? scrolling(
          table(
            ["org", "semantic search", "windows embedded", "searchable by meaning", "backlog (events)", "lag", "stalled keys", "poison windows", "knowledge gaps"],
            orgs.map(orgRow),
            { class: "orgs" },
          ),
          "orgs",
        )
      : "",
  );
}

// --- search page ---

function weights(text) {
  const out = {};
  for (const part of text.split(",")) {
    const [leg, value] = part.split("=").map((s) => s.trim());
    if (leg) out[leg] = Number(value);
  }
  return out;
}

const KIND_TEXT = { HIT_KIND_WINDOW: "conversation window", HIT_KIND_MESSAGE: "message" };
// A hit under this share of the top hit's score (or at 0) is weak: listed apart.
const WEAK_SHARE = 0.1;

function explanationOf(hit) {
  const legs = hit.explanation.legs || [];
  const parts = legs.map((l) => ({ name: l.leg, value: Number(l.weight || 0) * Number(l.normalized_score || 0) }));
  const fused = Number(hit.explanation.fused_score || 0);
  const rerank = hit.explanation.rerank_score;
  return el(
    "details",
    { class: "explanation" },
    el("summary", {}, `explanation: fused ${fixed(fused)}` + (rerank !== undefined && rerank !== null ? `, rerank ${fixed(rerank)}` : "")),
    parts.length
      ? barChart(
          `each leg's part of the fused score ${fixed(fused)}: ` + parts.map((p) => `${p.name} ${fixed(p.value)}`).join(", "),
          parts,
          Math.max(fused, ...parts.map((p) => p.value)),
        )
      : null,
    table(
      ["leg", "rank", "raw score", "normalized", "weight"],
      legs.map((l) => [l.leg, String(l.rank || 0), fixed(l.raw_score), fixed(l.normalized_score), fixed(l.weight, 2)]),
      { class: "legs" },
    ),
  );
}

function searchHit(hit, index, weak) {
  const context = (messages, label) =>
    messages && messages.length
      ? el("ol", { class: "context", "aria-label": label }, ...messages.map((m) => el("li", {}, m.text || "")))
      : null;
  return el(
    "article",
    { class: weak ? "hit weak" : "hit", "data-hit": String(index) },
    el(
      "p",
      { class: "meta" },
      `#${index + 1} · score ${fixed(hit.score)} · ${KIND_TEXT[hit.kind] || hit.kind || ""} · ${hit.provider || ""}/${hit.external_channel_id || ""} · ${when(hit.start_time)}`,
    ),
    context(hit.context_before, "before"),
    el("p", { class: "text" }, ...highlighted(hit.text || "", hit.highlights)),
    context(hit.context_after, "after"),
    hit.explanation ? explanationOf(hit) : null,
  );
}

function searchRequest(form) {
  const data = new FormData(form);
  const request = {
    org_id: String(data.get("org") || "").trim(),
    query: String(data.get("query") || ""),
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
  return request;
}

async function runSearch(signal, form) {
  const request = searchRequest(form);
  if (!request.org_id || !request.query.trim()) {
    showBanner([]);
    results(el("p", { class: "hint" }, request.org_id ? "Type a query." : "Pick an org, then type a query."));
    return;
  }
  const response = await api("search", request, signal);
  showBanner(degradationLines(response.degradations));
  const stages = (response.stage_times || []).map((s) => [s.stage, millis(s.duration)]);
  const hits = response.hits || [];
  const top = hits.reduce((m, h) => Math.max(m, Number(h.score || 0)), 0);
  const isWeak = (h) => top > 0 && Number(h.score || 0) < top * WEAK_SHARE;
  const strong = hits.filter((h) => !isWeak(h));
  const weak = hits.filter(isWeak);
  const onMap = `/map?org=${encodeURIComponent(request.org_id)}&q=${encodeURIComponent(request.query)}`;
  results(
    el(
      "p",
      { class: "summary" },
      `${hits.length} hit(s) for “${request.query}”${weak.length ? ` (${weak.length} weak)` : ""} · model ${response.model || "none"}${response.reranked ? " · reranked" : ""}`,
    ),
    traceIds.has(response) ? el("p", { class: "trace" }, `trace ${traceIds.get(response)}`) : "",
    el("p", {}, el("a", { href: onMap, class: "to-map" }, "See these hits on the org's map")),
    stages.length ? table(["stage", "time"], stages, { class: "stages" }) : "",
    ...strong.map((h) => searchHit(h, hits.indexOf(h), false)),
    weak.length
      ? el(
          "section",
          { class: "weak-hits", "aria-labelledby": "weak-heading" },
          el("h3", { id: "weak-heading" }, `Weak hits: scored under ${WEAK_SHARE * 100}% of the top hit`),
          ...weak.map((h) => searchHit(h, hits.indexOf(h), true)),
        )
      : "",
  );
  $("results").dataset.query = request.query;
}

// --- map page: an org's windows (or an Index namespace's documents) on a plane ---

const MAP_WIDTH = 640;
const MAP_HEIGHT = 400;
const MAP_PAD = 12;
const MAP_HITS = 20; // the hits a search on the map lights up
const MAP_PICK_TRIES = 10; // orgs of the picker tried when the one filled in has no window
// The map drawn last: its points, their circles (in the points' order) and what it shows.
const mapState = { points: [], circles: [], where: null, lit: new Set(), detail: null, summary: null };

function mapWhere(form) {
  const data = new FormData(form);
  if (data.get("source") === "index") return { namespace: String(data.get("map_namespace") || "").trim() };
  return { org_id: String(data.get("org") || "").trim() };
}

const whereText = (where) => ("namespace" in where ? `namespace ${where.namespace || "(default)"}` : `org ${where.org_id}`);

function showSourceFields() {
  const index = $("source").value === "index";
  $("org").closest("label").hidden = index;
  $("map_namespace").closest("label").hidden = !index;
}

function pointLabel(point, lit) {
  return `${lit ? "search hit, " : ""}${point.channel || "no channel"}, ${when(point.time)}: ${point.text}`;
}

function showPoint(i) {
  const point = mapState.points[i];
  if (!point || !mapState.detail) return;
  const lit = mapState.lit.has(point.id);
  mapState.detail.replaceChildren(
    el("span", { class: "meta" }, `${lit ? "search hit · " : ""}${point.channel || "no channel"} · ${when(point.time)} · ${point.id}`),
    el("span", { class: "text" }, point.text),
  );
  mapState.circles.forEach((c, k) => c.classList.toggle("current", k === i));
}

// Roving focus (a listbox's): one point in the Tab order, the arrow keys move it.
function focusPoint(i) {
  const circles = mapState.circles;
  if (!circles.length) return;
  const next = Math.max(0, Math.min(circles.length - 1, i));
  circles.forEach((c, k) => {
    c.setAttribute("tabindex", k === next ? "0" : "-1");
    c.setAttribute("aria-selected", k === next ? "true" : "false");
  });
  circles[next].focus();
}

function mapKeys(event) {
  const at = mapState.circles.indexOf(event.target);
  if (at < 0) return;
  const moves = { ArrowRight: at + 1, ArrowDown: at + 1, ArrowLeft: at - 1, ArrowUp: at - 1, Home: 0, End: mapState.circles.length - 1 };
  if (!(event.key in moves)) return;
  event.preventDefault();
  focusPoint(moves[event.key]);
}

function drawMap(response, where) {
  const points = response.points || [];
  const channels = [...new Set(points.map((p) => p.channel))].sort();
  const classOf = (channel) => {
    const k = channels.indexOf(channel);
    return k < SERIES_CLASSES.length ? SERIES_CLASSES[k] : "s-other";
  };
  const x = (v) => (MAP_PAD + ((v + 1) / 2) * (MAP_WIDTH - 2 * MAP_PAD)).toFixed(1);
  const y = (v) => (MAP_PAD + ((1 - v) / 2) * (MAP_HEIGHT - 2 * MAP_PAD)).toFixed(1);
  const what = "namespace" in where ? "document" : "window";
  mapState.points = points;
  mapState.where = where;
  mapState.lit = new Set();
  mapState.detail = el("p", { id: "map-detail", class: "map-detail", "aria-live": "polite" }, `Hover or focus a point to read its ${what}.`);
  mapState.summary = el("p", { class: "map-hits", role: "status" });
  const explained = (response.explained || []).map((share) => `${Math.round(share * 100)}%`).join(" and ");
  const summary = el(
    "p",
    { class: "summary" },
    points.length
      ? `${count(points.length)} ${what}(s) of ${whereText(where)}${response.truncated ? `, the ${count(response.limit)} most recent (older ones are not drawn)` : ""} · model ${response.model || "–"} · the axes hold ${explained} of the variance`
      : `${whereText(where)} has no ${what} embedded with model ${response.model || "–"} yet`,
  );
  if (!points.length) {
    mapState.circles = [];
    results(summary);
    return;
  }
  mapState.circles = points.map((point, i) => {
    const circle = svg("circle", {
      class: `point ${classOf(point.channel)}`,
      cx: x(point.x),
      cy: y(point.y),
      r: 5,
      role: "option",
      tabindex: i === 0 ? 0 : -1,
      "aria-selected": i === 0 ? "true" : "false",
      "aria-label": pointLabel(point, false),
      "data-id": point.id,
    });
    circle.addEventListener("mouseenter", () => showPoint(i));
    circle.addEventListener("focus", () => showPoint(i));
    return circle;
  });
  const map = svg(
    "svg",
    {
      viewBox: `0 0 ${MAP_WIDTH} ${MAP_HEIGHT}`,
      class: "map",
      role: "listbox",
      "aria-label": `Map of ${whereText(where)}: ${points.length} ${what}(s), near points say similar things; the arrow keys move between them`,
    },
    svg("rect", { class: "frame", x: 0, y: 0, width: MAP_WIDTH, height: MAP_HEIGHT, "aria-hidden": "true" }),
    ...mapState.circles,
  );
  map.addEventListener("keydown", mapKeys);
  const legend = el(
    "ul",
    { class: "legend" },
    ...channels.slice(0, SERIES_CLASSES.length).map((c) => el("li", {}, el("span", { class: `swatch ${classOf(c)}`, "aria-hidden": "true" }), c || "no channel")),
    channels.length > SERIES_CLASSES.length ? el("li", {}, el("span", { class: "swatch s-other", "aria-hidden": "true" }), `${channels.length - SERIES_CLASSES.length} more`) : null,
  );
  results(summary, el("figure", { class: "map-figure" }, map, legend, mapState.detail), mapState.summary);
  $("results").dataset.map = String(Number($("results").dataset.map || 0) + 1);
}

// Light up `ids` (a search's hits) on the map drawn; the rest dim.
function lightHits(ids, query, total) {
  const lit = new Set(ids.filter((id) => mapState.points.some((p) => p.id === id)));
  mapState.lit = lit;
  mapState.circles.forEach((circle, i) => {
    const on = lit.has(mapState.points[i].id);
    circle.classList.toggle("hit", on);
    circle.setAttribute("r", on ? "8" : "5");
    circle.setAttribute("aria-label", pointLabel(mapState.points[i], on));
    if (on) circle.parentNode.append(circle); // drawn on top
  });
  const map = $("results").querySelector("svg.map");
  if (map) map.classList.toggle("lit", lit.size > 0);
  if (mapState.summary) {
    mapState.summary.textContent = query
      ? `${lit.size} of the ${total} hit(s) for “${query}” ${lit.size === 1 ? "is" : "are"} on the map${total > lit.size ? " (the others are messages, or older than the map)" : ""}`
      : "";
  }
  $("results").dataset.lit = query;
}

async function runMapHits(signal, form) {
  if (!mapState.where) return;
  const where = mapState.where;
  const query = String(new FormData(form).get("map_query") || "").trim();
  if (!query) {
    lightHits([], "", 0);
    return;
  }
  let ids;
  if ("namespace" in where) {
    const response = await api("index-query", { namespace: where.namespace, data: query, mode: "QUERY_MODE_HYBRID", top_k: MAP_HITS }, signal);
    ids = (response.results || []).map((d) => (d.document || d).id);
  } else {
    const response = await api("search", { org_id: where.org_id, query, mode: "SEARCH_MODE_HYBRID", limit: MAP_HITS }, signal);
    ids = (response.hits || []).map((h) => h.id);
  }
  if (where !== mapState.where) return; // another map was drawn meanwhile
  lightHits(ids, query, ids.length);
}

async function runMap(signal, form) {
  let where = mapWhere(form);
  if ("org_id" in where && !where.org_id) {
    mapState.where = null;
    results(el("p", { class: "hint" }, "Pick an org (or an Index namespace) to draw its map."));
    return;
  }
  let response = await api("map", where, signal);
  const field = $("org");
  if ("org_id" in where && !(response.points || []).length && field && field.dataset.picked) {
    // The org filled in has no window embedded: the next orgs of the picker, a few at most.
    const others = Array.from($("orgs").options, (o) => o.value).filter((o) => o !== where.org_id);
    for (const org of others.slice(0, MAP_PICK_TRIES)) {
      const tried = await api("map", { org_id: org }, signal);
      if ((tried.points || []).length) {
        field.value = org;
        where = { org_id: org };
        response = tried;
        break;
      }
    }
  }
  drawMap(response, where);
  await runMapHits(signal, form);
}

// --- index page ---

function documents(title, docs) {
  return el(
    "section",
    { class: "documents" },
    el("h3", {}, title),
    docs && docs.length
      ? scrolling(
          table(
            ["id", "score", "data", "metadata"],
            docs.map((d) => {
              const doc = d.document || d;
              return [doc.id || "", fixed(d.score), doc.data || "", doc.metadata ? JSON.stringify(doc.metadata) : ""];
            }),
          ),
          title,
        )
      : el("p", {}, "none"),
  );
}

async function runIndexQuery(signal, form) {
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
  const response = await api("index-query", request, signal);
  showBanner(degradationLines(response.degradations));
  results(documents(`results (${response.mode || ""})`, response.results));
}

async function runAgentContext(signal, form) {
  const data = new FormData(form);
  const namespace = new FormData($("index-form")).get("namespace") || "";
  const response = await api("agent-context", { namespace, app_id: data.get("app_id"), message: data.get("message") }, signal);
  showBanner(degradationLines(response.degradations));
  results(
    documents("similar tickets", response.similar_tickets),
    documents("knowledge", response.knowledge),
    documents("good responses", response.good_responses),
  );
}

async function loadIndexInfo(signal) {
  const info = await api("index-info", {}, signal);
  const spaces = info.namespaces || [];
  $("info").replaceChildren(
    el("h3", {}, "Namespaces"),
    el("p", {}, `${count(info.document_count)} document(s) · model ${info.model || "–"} · ${info.dimension || 0} dimensions${info.sparse_supported ? " · sparse" : ""}`),
    spaces.length
      ? table(
          ["namespace", "documents", "map"],
          spaces.map((n) => [n.namespace || "(default)", count(n.document_count), el("a", { href: `/map?namespace=${encodeURIComponent(n.namespace || "")}`, "aria-label": `map of ${n.namespace || "the default namespace"}` }, "map")]),
          { class: "namespaces" },
        )
      : el("p", {}, "none"),
  );
}

// --- sweep page ---

async function retry(org, id, button) {
  button.disabled = true;
  try {
    const response = await api("retry-poison", { org_id: org, ids: [id] });
    showError(null);
    showBanner([`released ${response.windows_released || 0} poison window(s)`]);
    await sweepLoader.run($("sweep-form"));
  } catch (error) {
    showError(error);
    button.disabled = false;
  }
}

async function runStatus(signal, form) {
  const org = String(new FormData(form).get("org") || "").trim();
  if (!org) {
    // Every org's status would be every key's: the org table instead, each org a link.
    await loadOrgFigures(signal, "", "");
    return;
  }
  const response = await api("sweep-status", { org_id: org }, signal);
  // Whether the org's flags let the sweep embed it, and which are off if not.
  const flags = await api("flags", { org_id: org }, signal);
  const watermarks = response.watermarks || [];
  const poison = response.poison_windows || [];
  const stalled = watermarks.filter((w) => (w.consecutive_failures || 0) > 0);
  const figures = [
    ["model", response.model || ""],
    ["embedded windows", count(response.embedded_windows)],
    ["backlog (pending events)", count(response.pending_events)],
    ["unswept events", count(response.unswept_events)],
    ["unswept lag", ago(parseFloat(response.unswept_lag || "0"))],
    ["max lag", ago(watermarks.reduce((m, w) => Math.max(m, parseFloat(w.lag || "0")), 0))],
    ["stalled keys", String(stalled.length)],
    ["poison windows", String(poison.length)],
  ];
  results(
    el("p", { class: flags.swept ? "flags" : "flags off" }, flags.swept ? `${org}: its flags let the sweep embed it` : `${org} is not swept: ${flags.reason}`),
    table(["figure", "value"], figures, { class: "figures" }),
    el("h3", {}, "keys"),
    watermarks.length
      ? scrolling(
          table(
            ["key", "model", "pending", "lag", "last run", "failures"],
            watermarks.map((w) => [
              `${w.org_id}/${w.provider}/${w.external_channel_id}`, w.model || "", String(w.pending_events || 0),
              ago(parseFloat(w.lag || "0")), when(w.updated_at), String(w.consecutive_failures || 0),
            ]),
            { class: "keys" },
          ),
          "keys",
        )
      : el("p", {}, "none"),
    el("h3", {}, "stalled keys"),
    stalled.length
      ? scrolling(
          table(
            ["key", "failures", "last error"],
            stalled.map((w) => [`${w.org_id}/${w.provider}/${w.external_channel_id}`, String(w.consecutive_failures), w.last_error || ""]),
          ),
          "stalled keys",
        )
      : el("p", {}, "none"),
    el("h3", {}, "poison windows"),
    poison.length
      ? scrolling(
          table(
            ["window", "key", "attempts", "error", "action"],
            poison.map((p) => {
              const button = el("button", { type: "button", class: "retry", "data-id": p.id }, "Retry");
              button.addEventListener("click", () => retry(p.org_id, p.id, button));
              return [p.id, `${p.org_id}/${p.provider}/${p.external_channel_id}`, String(p.attempts || 0), p.error || "", button];
            }),
            { class: "poison" },
          ),
          "poison windows",
        )
      : el("p", { class: "no-poison" }, "none"),
  );
}

// --- models page ---

function modelTable(title, info) {
  const rows = Object.entries(info).map(([key, value]) => [key, Array.isArray(value) ? value.join(", ") : String(value)]);
  return el("section", { class: "model" }, el("h3", {}, title), scrolling(table(["field", "value"], rows), title));
}

async function runModels(signal) {
  const response = await api("models", {}, signal);
  const down = [response.embedder, response.reranker].filter((info) => info.error).map((info) => info.error);
  showBanner(down);
  results(
    modelTable("embedder", response.embedder),
    modelTable("reranker", response.reranker),
    modelTable("fusion (search)", response.fusion || {}),
  );
}

// --- knowledge gaps page ---

async function forgetGaps(org, request, button) {
  button.disabled = true;
  try {
    const response = await api("forget-gaps", { org_id: org, ...request });
    showError(null);
    showBanner([`forgot ${response.deleted || 0} knowledge gap(s) of ${org}`]);
    await gapsLoader.run($("gaps-form"));
  } catch (error) {
    showError(error);
    button.disabled = false;
  }
}

async function runGaps(signal, form) {
  const data = new FormData(form);
  const org = String(data.get("gaps_org") || "").trim();
  if (!org) {
    results(el("p", { class: "hint" }, "Type an app id (the Overview's orgs link to theirs)."));
    return;
  }
  const request = { org_id: org, limit: 100 };
  const days = Number(data.get("since") || 0);
  if (days) request.since = new Date(Date.now() - days * 86400000).toISOString();
  const response = await api("list-gaps", request, signal);
  const groups = response.groups || [];
  const forgetAll = el("button", { type: "button", class: "forget-all" }, "Forget every gap of this app");
  forgetAll.addEventListener("click", () => forgetGaps(org, { all: true }, forgetAll));
  results(
    el("p", { class: "summary" }, `${groups.length} group(s) of ${count(response.gaps)} question(s) no knowledge article answered${response.truncated ? " (the most recent only)" : ""}`),
    groups.length
      ? scrolling(
          table(
            ["question", "asked", "first seen", "last seen", "best knowledge score", "also asked as", "action"],
            groups.map((g) => {
              const button = el("button", { type: "button", class: "forget" }, "Forget");
              button.setAttribute("aria-label", `Forget “${g.query}”`);
              button.addEventListener("click", () => forgetGaps(org, { ids: g.gap_ids }, button));
              return [
                g.query,
                count(g.count),
                when(g.first_seen),
                when(g.last_seen),
                g.best_score === undefined || g.best_score === null ? "no article" : fixed(g.best_score, 3),
                (g.examples || []).join(" · "),
                button,
              ];
            }),
            { class: "gaps" },
          ),
          "knowledge gaps",
        )
      : el("p", {}, "none"),
    groups.length ? forgetAll : "",
  );
}

// --- wiring ---

async function loadOrgs() {
  const list = $("orgs");
  if (!list || lacks("search")) return;
  try {
    const { orgs } = await api("orgs", {});
    list.replaceChildren(...orgs.map((org) => el("option", { value: org })));
    const field = $("org");
    // An org to start with, so that the Search page searches as soon as a query is typed.
    const page = document.body.dataset.page;
    if (field && !field.value && (page === "search" || page === "map") && orgs.length) {
      field.value = orgs[0];
      field.dataset.picked = "1"; // filled in, not chosen: the Map may move on to an org with windows
      field.addEventListener("input", () => delete field.dataset.picked, { once: true });
    }
  } catch (error) {
    showError(error);
  }
}

// A form's submit runs `loader` (cancelling its load under way) and counts in data-ready.
function submit(id, loader) {
  const form = $(id);
  if (!form) return;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    showError(null);
    form.setAttribute("aria-busy", "true");
    try {
      await loader.run(form);
    } catch (error) {
      showError(error);
    } finally {
      form.removeAttribute("aria-busy");
      document.body.dataset.ready = String(Number(document.body.dataset.ready || 0) + 1);
    }
  });
}

const overviewLoader = new Loader("search", loadHistory);
overviewLoader.denied = (why) => $("health").replaceChildren(el("p", { class: "needs" }, why));
const orgsLoader = new Loader("admin", loadOrgFigures);
const searchLoader = new Loader("search", runSearch);
// The Index page's two forms draw the same results: one loader, each form its call.
const indexLoader = new Loader("search", (signal, form) =>
  form.id === "context-form" ? runAgentContext(signal, form) : runIndexQuery(signal, form),
);
const infoLoader = new Loader("search", loadIndexInfo);
infoLoader.denied = (why) => $("info").replaceChildren(el("p", { class: "needs" }, why));
const sweepLoader = new Loader("admin", runStatus);
const modelsLoader = new Loader("search", runModels);
const gapsLoader = new Loader("admin", runGaps);
const mapLoader = new Loader("search", runMap);
const mapHitsLoader = new Loader("search", runMapHits);

// The Map's namespace picker: the Index's namespaces.
async function loadNamespaces() {
  const list = $("namespaces");
  if (!list || lacks("search")) return;
  try {
    const info = await api("index-info", {});
    list.replaceChildren(...(info.namespaces || []).map((n) => el("option", { value: n.namespace || "" })));
  } catch (error) {
    showError(error);
  }
}

// The Map: a new org or namespace draws its map; a query typed lights its hits up (debounced).
function mapControls() {
  const form = $("map-form");
  let timer = null;
  const params = new URLSearchParams(location.search);
  if (params.has("namespace")) {
    $("source").value = "index";
    $("map_namespace").value = params.get("namespace") || "";
  }
  fromUrl("org");
  fromUrl("map_query", "q");
  showSourceFields();
  const light = async () => {
    try {
      await mapHitsLoader.run(form);
      showError(null);
    } catch (error) {
      showError(error);
    }
  };
  const redraw = async () => {
    clearTimeout(timer);
    try {
      await mapLoader.run(form);
      showError(null);
    } catch (error) {
      showError(error);
    }
  };
  $("source").addEventListener("change", () => {
    showSourceFields();
    redraw();
  });
  $("org").addEventListener("change", redraw);
  $("map_namespace").addEventListener("change", redraw);
  $("map_query").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(light, TYPING_MS);
  });
  form.addEventListener("submit", () => clearTimeout(timer), { capture: true });
  submit("map-form", mapLoader);
}

function searchAsYouType() {
  const form = $("search-form");
  let timer = null;
  const later = () => {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      try {
        await searchLoader.run(form);
        showError(null);
      } catch (error) {
        showError(error);
      }
    }, TYPING_MS);
  };
  form.addEventListener("input", later);
  form.addEventListener("change", later);
  form.addEventListener("submit", () => clearTimeout(timer), { capture: true });
}

function fromUrl(field, name = "org") {
  const value = new URLSearchParams(location.search).get(name);
  if (value && $(field)) $(field).value = value;
}

function startPage(page) {
  const form = (id) => () => [$(id)];
  if (page === "overview") {
    loaders.push([overviewLoader, () => []]);
    loaders.push([orgsLoader, () => [orgPages.query, orgPages.afters[orgPages.afters.length - 1]]]);
    $("orgs-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      orgPages.query = String($("org_query").value || "").trim();
      orgPages.afters = [""];
      try {
        await orgsLoader.run(orgPages.query, "");
        showError(null);
      } catch (error) {
        showError(error);
      } finally {
        document.body.dataset.ready = String(Number(document.body.dataset.ready || 0) + 1);
      }
    });
    const turn = async (forward) => {
      if (forward && orgPages.next) orgPages.afters.push(orgPages.next);
      else if (!forward && orgPages.afters.length > 1) orgPages.afters.pop();
      else return;
      try {
        await orgsLoader.run(orgPages.query, orgPages.afters[orgPages.afters.length - 1]);
        showError(null);
      } catch (error) {
        showError(error);
      }
      document.body.dataset.ready = String(Number(document.body.dataset.ready || 0) + 1);
    };
    $("orgs-next").addEventListener("click", () => turn(true));
    $("orgs-prev").addEventListener("click", () => turn(false));
  } else if (page === "search") {
    fromUrl("org");
    fromUrl("query", "q");
    submit("search-form", searchLoader);
    searchAsYouType();
    loaders.push([searchLoader, form("search-form")]);
  } else if (page === "map") {
    mapControls();
    loaders.push([mapLoader, form("map-form")]);
  } else if (page === "index") {
    submit("index-form", indexLoader);
    submit("context-form", indexLoader);
    loaders.push([infoLoader, () => []]);
  } else if (page === "sweep") {
    fromUrl("org");
    submit("sweep-form", sweepLoader);
    loaders.push([sweepLoader, form("sweep-form")]);
  } else if (page === "models") {
    submit("models-form", modelsLoader);
    loaders.push([modelsLoader, () => []]);
  } else if (page === "gaps") {
    fromUrl("gaps_org");
    submit("gaps-form", gapsLoader);
    loaders.push([gapsLoader, form("gaps-form")]);
  }
}

// The page's first load; again once a token is entered.
async function openPage() {
  if (!(await readAuth())) return;
  await loadOrgs();
  await loadNamespaces();
  for (const [loader, args] of loaders) {
    // The Search page searches once on opening only when it has a query (from ?q=).
    if (loader === searchLoader && !$("query").value) {
      if (!lacks("search")) results(el("p", { class: "hint" }, $("org").value ? "Type a query: hits show as you type." : "Pick an org, then type a query."));
      continue;
    }
    loader.refresh(...args());
  }
}

function start() {
  const tokenForm = $("token-form");
  $("token-state").textContent = token() ? "token set" : "no token";
  tokenForm.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    $("token-state").textContent = token() ? "token set" : "no token";
    openPage();
  });
  startPage(document.body.dataset.page);
  openPage();
  // Current while visible: every REFRESH_MS, and at once when the tab is shown again. The
  // Search page's hits are not searched again (a query's answer is the one typed for),
  // nor is the Map drawn again (a projection serve computes: drawn when asked for).
  const still = () => ["search", "map"].includes(document.body.dataset.page);
  setInterval(() => {
    if (!still()) refreshAll();
  }, REFRESH_MS);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && !still()) refreshAll();
  });
  document.body.dataset.started = "true";
}

start();
