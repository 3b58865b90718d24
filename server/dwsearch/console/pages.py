"""The console's pages: server-rendered HTML shells (forms, navigation) with no data in them.

What a page shows comes from its script (static/console.js), which calls the JSON API with
the operator's token as the page opens, again every few seconds while it is visible, and
when a form is sent, and writes every text it receives as text (textContent), never as
markup; its plots are SVG drawn by the same script. The shells hold no inline script or style (the Content-Security-Policy forbids
both); the few values put in them are escaped (html.escape)."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape


@dataclass(frozen=True)
class Page:
    name: str  # its path, /{name}
    title: str
    form: str  # the page's own controls (HTML)
    results: str = '<div id="results" aria-live="polite"></div>'


def _select(name: str, label: str, options: list[tuple[str, str]]) -> str:
    rows = "".join(f'<option value="{escape(v)}">{escape(text)}</option>' for v, text in options)
    return f'<label>{escape(label)} <select name="{escape(name)}" id="{escape(name)}">{rows}</select></label>'


def _input(name: str, label: str, *, kind: str = "text", value: str = "", extra: str = "") -> str:
    return (
        f'<label>{escape(label)} <input type="{kind}" name="{escape(name)}" id="{escape(name)}" '
        f'value="{escape(value)}" {extra}></label>'
    )


ORG_FIELD = (
    _input("org", "Org", extra='list="orgs" required autocomplete="off"') + '<datalist id="orgs"></datalist>'
)

OVERVIEW = Page(
    "overview",
    "Overview",
    '<section id="health" class="health" aria-label="health at a glance"></section>'
    '<section id="charts" class="charts" aria-label="serve over the last hour"></section>'
    '<h3 id="orgs-heading">Orgs</h3>'
    '<form id="orgs-form" class="query" role="search" aria-labelledby="orgs-heading">'
    + _input("org_query", "Find orgs (part of the id)", kind="search", extra='autocomplete="off"')
    + '<button type="submit">Find</button></form>',
    '<div id="results"></div>'
    '<nav class="pager" aria-label="org pages">'
    '<button type="button" id="orgs-prev" disabled>Previous page</button>'
    '<button type="button" id="orgs-next" disabled>Next page</button></nav>',
)

SEARCH = Page(
    "search",
    "Search",
    '<form id="search-form" class="query" role="search">'
    + ORG_FIELD
    + _input("query", "Query", extra='required size="40"')
    + _select(
        "mode",
        "Mode",
        [
            ("SEARCH_MODE_HYBRID", "hybrid"),
            ("SEARCH_MODE_FTS", "full text"),
            ("SEARCH_MODE_SEMANTIC", "semantic"),
        ],
    )
    + _select(
        "fusion",
        "Fusion",
        [
            ("SEARCH_FUSION_UNSPECIFIED", "server default"),
            ("SEARCH_FUSION_WEIGHTED", "weighted"),
            ("SEARCH_FUSION_RRF", "RRF"),
        ],
    )
    + _input("weights", "Weights (leg=weight, …)", extra='placeholder="fts=1,dense=1" size="24"')
    + _select("rerank", "Rerank", [("", "server default"), ("true", "on"), ("false", "off")])
    + _input("limit", "Limit", kind="number", value="10", extra='min="1" max="100"')
    + _select("sort", "Sort", [("SEARCH_SORT_RELEVANCE", "relevance"), ("SEARCH_SORT_NEWEST", "newest")])
    + _input("context", "Context messages", kind="number", value="0", extra='min="0" max="10"')
    + _input("start", "From (UTC)", kind="datetime-local")
    + _input("end", "To (UTC)", kind="datetime-local")
    + '<button type="submit">Search</button></form>'
    + '<p class="hint">Hits show as you type.</p>',
)

INDEX = Page(
    "index",
    "Index",
    '<form id="index-form" class="query">'
    + _input("namespace", "Namespace")
    + _input("data", "Query", extra='required size="40"')
    + _select(
        "mode",
        "Mode",
        [("QUERY_MODE_HYBRID", "hybrid"), ("QUERY_MODE_DENSE", "dense"), ("QUERY_MODE_SPARSE", "sparse")],
    )
    + _input("filter", "Filter", extra='size="40" placeholder="kind = \'knowledge\'"')
    + _input("top_k", "Top k", kind="number", value="10", extra='min="1" max="100"')
    + '<button type="submit">Query</button></form>'
    + '<form id="context-form" class="query">'
    + _input("app_id", "App id", extra="required")
    + _input("message", "Agent context for message", extra='required size="40"')
    + '<button type="submit">Build agent context</button></form>'
    + '<section id="info" class="info" aria-label="namespaces"></section>',
)

SWEEP = Page(
    "sweep",
    "Sweep",
    '<form id="sweep-form" class="query">'
    + ORG_FIELD.replace(" required", "")
    + '<button type="submit">Status</button></form>',
)

MODELS = Page(
    "models",
    "Models",
    '<form id="models-form" class="query"><button type="submit">Refresh</button></form>',
)

GAPS = Page(
    "gaps",
    "Knowledge gaps",
    '<form id="gaps-form" class="query">'
    + _input("gaps_org", "App id", extra='required autocomplete="off"')
    + _select(
        "since", "Recorded in", [("7", "the last 7 days"), ("30", "the last 30 days"), ("", "any time")]
    )
    + '<button type="submit">Show</button></form>',
)

MAP = Page(
    "map",
    "Map",
    '<form id="map-form" class="query">'
    + _select("source", "Map of", [("org", "an org's conversations"), ("index", "an Index namespace")])
    + ORG_FIELD.replace(" required", "")
    + _input("map_namespace", "Namespace", extra='list="namespaces" autocomplete="off"')
    + '<datalist id="namespaces"></datalist>'
    + _input("map_query", "Light up a search's hits", kind="search", extra='size="30" autocomplete="off"')
    + '<button type="submit">Show</button></form>'
    + '<p class="hint">Each point is a window (or a document) placed by its meaning: near points say '
    "similar things. Hover or focus a point to read it; the arrow keys move between points.</p>",
)

PAGES = {page.name: page for page in (OVERVIEW, SEARCH, MAP, INDEX, SWEEP, MODELS, GAPS)}


def render(page: Page) -> str:
    """The page's HTML: the token field, the navigation, the page's form and results."""
    nav = "".join(
        f'<a href="/{p.name}"' + (' aria-current="page"' if p is page else "") + f">{escape(p.title)}</a>"
        for p in PAGES.values()
    )
    return (
        "<!doctype html>"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>dwsearch console: {escape(page.title)}</title>"
        '<link rel="stylesheet" href="/static/console.css">'
        '<script type="module" src="/static/console.js"></script>'
        f'</head><body data-page="{escape(page.name)}">'
        f'<header><h1>dwsearch console</h1><nav aria-label="pages">{nav}</nav>'
        '<form id="token-form" class="token">'
        '<label>Bearer token <input type="password" id="token" name="token" autocomplete="off" size="24"></label>'
        '<button type="submit">Use token</button> <span id="token-state" role="status"></span></form></header>'
        f"<main><h2>{escape(page.title)}</h2>{page.form}"
        '<div id="error" class="error" role="alert" hidden></div>'
        '<div id="banner" class="banner" role="status" hidden></div>'
        f"{page.results}</main></body></html>"
    )
