"""The tenancy benchmark's populations (bench.tenancy): a long tail of small orgs and a
few large ones, every org a few channels, every channel's windows swept and its
watermark at its last event, as a deployment looks between two sweeps.

Built inside Postgres from a spec, fast: events, windows, the ledger and watermarks by
INSERT ... SELECT over generate_series, vectors from a pool of topic vectors copied in
once (bench.fake_embedder's topics, so HNSW recall means something). Everything about an
org is a function of its name and size: an org of the 50-org population and the org of
the same name in the 10,000-org one hold the same events, windows and vectors, so a
figure measured on both differs only by what surrounds it. Rows go in in time order,
orgs interleaved, as a live deployment writes them: a small org's rows are spread over
the tables' pages, not packed together.

A built population is kept (a row in bench_tenancy_population holds its spec) and
reused while the spec is unchanged.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

import numpy as np
import psycopg
from pgvector import HalfVector
from pgvector.psycopg import register_vector

from bench.fake_embedder import topic_vectors
from dwsearch_testkit.text import MIXED_CHAT_WORDS

DIM = 1024
MODEL = "fake/deterministic-v1"
PROVIDER = "whatsapp"
T0 = datetime(2025, 12, 1, tzinfo=UTC)
# Windows of one channel over this many days; each window is its own session (hours
# apart, over SESSION_GAP), MESSAGES_PER_WINDOW messages a minute apart.
SPAN_DAYS = 360
MESSAGES_PER_WINDOW = 4
# Every DENIED_EVERY-th window of a channel also has a denied event: ineligible traffic.
DENIED_EVERY = 20
# Vectors: the large orgs take POOL_LARGE rows of the pool in order (each row once), the
# small orgs draw from the rest by hash.
POOL_LARGE = 140_000
POOL = 300_000
# The mixed chat words (dwsearch_testkit.text, as bench.search's), and more of the same.
WORDS = (
    *MIXED_CHAT_WORDS,
    "lah",
    "boleh",
    "tak",
    "nak",
    "mana",
    "kenapa",
    "sudah",
    "dah",
    "lagi",
    "berapa",
    "harga",
    "stock",
    "size",
    "colour",
    "ship",
    "today",
    "tomorrow",
    "weekend",
    "branch",
    "outlet",
    "member",
    "points",
    "redeem",
)


@dataclass(frozen=True)
class Spec:
    """A population: `small` orgs with lognormal window counts (median `small_median`,
    clipped to [small_min, small_max]) and `large` orgs of the given sizes, `keys` channels
    in all (large orgs `large_keys` each, the rest spread over the small ones)."""

    name: str
    small: int
    large: tuple[int, ...]
    keys: int
    small_median: int = 150
    small_sigma: float = 0.8
    small_min: int = 20
    small_max: int = 3_000
    large_keys: int = 40
    seed: int = 27
    version: int = 1
    # Orgs of this population's small tail also present, identical, in the other.
    shared_small: int = 40
    orgs: list[tuple[str, int, int]] = field(default_factory=list, compare=False, repr=False)

    def as_json(self) -> str:
        d = asdict(self)
        d.pop("orgs")
        return json.dumps(d, sort_keys=True)


def small_org(i: int) -> str:
    return f"org-{i:05d}"


def large_org(size: int) -> str:
    return f"big-{size // 1000}k"


def plan_orgs(spec: Spec) -> list[tuple[str, int, int]]:
    """(org, windows, channels) for every org. The first `shared_small` small orgs come
    from their own generator, so that both populations hold them alike."""
    rng = np.random.default_rng(spec.seed)
    sizes = np.clip(
        np.round(rng.lognormal(np.log(spec.small_median), spec.small_sigma, spec.small)),
        spec.small_min,
        spec.small_max,
    ).astype(int)
    shared = np.random.default_rng(spec.seed + 1)
    shared_sizes = np.clip(
        np.round(shared.lognormal(np.log(spec.small_median), spec.small_sigma, spec.shared_small)),
        spec.small_min,
        spec.small_max,
    ).astype(int)
    sizes[: spec.shared_small] = shared_sizes
    small_keys = spec.keys - spec.large_keys * len(spec.large)
    # Channels: at least 1, about proportional to size, summing to small_keys.
    weights = sizes / sizes.sum()
    channels = np.maximum(1, np.floor(weights * small_keys)).astype(int)
    shared_channels = np.maximum(1, np.minimum(shared_sizes // 15, 19))
    channels[: spec.shared_small] = shared_channels
    rest = small_keys - channels.sum()
    order = rng.permutation(np.arange(spec.shared_small, spec.small))
    j = 0
    while rest != 0 and len(order):
        i = order[j % len(order)]
        if rest > 0:
            channels[i] += 1
            rest -= 1
        elif channels[i] > 1:
            channels[i] -= 1
            rest += 1
        j += 1
    channels = np.minimum(channels, sizes)
    orgs = [(small_org(i), int(sizes[i]), int(channels[i])) for i in range(spec.small)]
    orgs += [(large_org(size), size, spec.large_keys) for size in spec.large]
    return orgs


TEN_THOUSAND = Spec(name="tenancy", small=9_996, large=(20_000, 30_000, 40_000, 50_000), keys=100_000)
FIFTY = Spec(name="tenancy50", small=46, large=(20_000, 30_000, 40_000, 50_000), keys=46 * 10 + 160)
QUICK_TEN_THOUSAND = Spec(name="tenancy_quick", small=996, large=(20_000,), keys=10_000, shared_small=20)
QUICK_FIFTY = Spec(name="tenancy50_quick", small=46, large=(20_000,), keys=46 * 10 + 40, shared_small=20)


def built(conn: psycopg.Connection, spec: Spec) -> bool:
    exists = conn.execute("SELECT to_regclass('bench_tenancy_population') IS NOT NULL").fetchone()[0]
    if not exists:
        return False
    row = conn.execute("SELECT spec FROM bench_tenancy_population").fetchone()
    return row is not None and row[0] == spec.as_json()


# Deterministic ids, and texts drawn by hash from SENTENCES sentences of chat words.
SENTENCES = 50_000
_FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION bench_uuid(t text) RETURNS uuid
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT md5(t)::uuid $$;
CREATE OR REPLACE FUNCTION bench_pick(t text) RETURNS int
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT (hashtext(t) & 2147483647) % {SENTENCES} $$;
"""


def sentences(seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 10, SENTENCES)
    picks = rng.integers(0, len(WORDS), int(lengths.sum()))
    out, i = [], 0
    for n in lengths:
        out.append(" ".join(WORDS[j] for j in picks[i : i + n]))
        i += n
    return out


def build(url: str, spec: Spec, *, log=print) -> dict[str, float]:
    """Build `spec` into the (migrated, empty) database at `url`; returns timings."""
    orgs = plan_orgs(spec)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute("SET work_mem = '256MB'")
        conn.execute(_FUNCTIONS)
        conn.execute(
            "DROP TABLE IF EXISTS bench_tenancy_population, bench_keys, bench_vectors, bench_sentences"
        )
        conn.execute("CREATE TABLE bench_sentences (n int PRIMARY KEY, text text)")
        with conn.cursor().copy("COPY bench_sentences FROM STDIN") as copy:
            for n, text in enumerate(sentences(spec.seed)):
                copy.write_row((n, text))
        conn.execute(
            "CREATE TABLE bench_keys (org_id text, channel text, windows int, org_rank int, large bool)"
        )
        rng = np.random.default_rng(spec.seed + 2)
        with conn.cursor().copy("COPY bench_keys FROM STDIN") as copy:
            for rank, (org, windows, channels) in enumerate(orgs):
                split = rng.multinomial(windows - channels, np.ones(channels) / channels) + 1
                for c, n in enumerate(split):
                    copy.write_row((org, f"ch-{c:03d}", int(n), rank, org.startswith("big-")))
        conn.execute("CREATE TABLE bench_vectors (n int PRIMARY KEY, v halfvec)")
        vrng = np.random.default_rng(spec.seed + 3)
        with conn.cursor().copy("COPY bench_vectors (n, v) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["int4", "halfvec"])
            for lo in range(0, POOL, 20_000):
                for i, v in enumerate(topic_vectors(vrng, 20_000, DIM)):
                    copy.write_row((lo + i, HalfVector(v)))
        timings["keys_vectors_s"] = time.perf_counter() - t
        log(f"  {spec.name}: {len(orgs)} orgs, keys and vector pool in {timings['keys_vectors_s']:.0f}s")

        # The secondary indexes go before the load and are built after it.
        indexes = _drop_secondary_indexes(conn)

        step = time.perf_counter()
        # One row per window: when it starts, in which channel; windows of a channel are
        # SPAN_DAYS / windows apart, each channel offset by its own hash.
        conn.execute(
            f"""CREATE TEMP TABLE bench_windows AS
                SELECT k.org_id, k.channel, w,
                       bench_uuid('w/' || k.org_id || '/' || k.channel || '/' || w) AS id,
                       timestamptz '{T0.isoformat()}'
                         + make_interval(secs => (('x' || substr(md5(k.org_id || k.channel), 1, 6))::bit(24)::int % 86400)
                                                 + w * ({SPAN_DAYS} * 86400.0 / k.windows)) AS start,
                       k.large, k.org_rank
                FROM bench_keys k, generate_series(0, k.windows - 1) AS w"""
        )
        conn.execute(
            f"""INSERT INTO dw_chat_events (id, org_id, provider, external_channel_id, event_type, decision,
                                            message_text, created_at)
                SELECT bench_uuid('e/' || w.org_id || '/' || w.channel || '/' || w.w || '/' || j),
                       w.org_id, '{PROVIDER}', w.channel, 'message',
                       CASE WHEN j < {MESSAGES_PER_WINDOW} THEN 'received' ELSE 'denied' END,
                       s.text, w.start + make_interval(mins => j)
                FROM bench_windows w
                CROSS JOIN LATERAL generate_series(0, CASE WHEN w.w % {DENIED_EVERY} = 0 THEN {MESSAGES_PER_WINDOW}
                                                           ELSE {MESSAGES_PER_WINDOW - 1} END) AS j
                JOIN bench_sentences s ON s.n = bench_pick(w.org_id || '/' || w.channel || '/' || w.w || '/' || j)
                ORDER BY w.start + make_interval(mins => j)"""
        )
        timings["events_s"] = time.perf_counter() - step
        log(f"  {spec.name}: events in {timings['events_s']:.0f}s")
        step = time.perf_counter()
        ids = (
            "ARRAY(SELECT bench_uuid('e/' || w.org_id || '/' || w.channel || '/' || w.w || '/' || j)"
            f" FROM generate_series(0, {MESSAGES_PER_WINDOW - 1}) AS j)"
        )
        conn.execute(
            f"""INSERT INTO dw_sweep_windows (id, org_id, provider, external_channel_id, model, status,
                                              window_start, window_end, source_message_ids)
                SELECT w.id, w.org_id, '{PROVIDER}', w.channel, '{MODEL}', 'embedded', w.start,
                       w.start + make_interval(mins => {MESSAGES_PER_WINDOW - 1}), {ids}
                FROM bench_windows w ORDER BY w.start"""
        )
        conn.execute(
            f"""INSERT INTO dw_sweep_window_events (org_id, model, event_id, window_id, text_md5)
                SELECT e.org_id, '{MODEL}', e.id, x.id, md5(e.message_text)::uuid
                FROM dw_sweep_windows x
                CROSS JOIN LATERAL unnest(x.source_message_ids) AS u(event_id)
                JOIN dw_chat_events e ON e.id = u.event_id
                ORDER BY x.window_start"""
        )
        timings["windows_ledger_s"] = time.perf_counter() - step
        log(f"  {spec.name}: windows and ledger in {timings['windows_ledger_s']:.0f}s")
        step = time.perf_counter()
        # Vectors: a large org's windows take the pool's rows in its own range, in order;
        # a small org's window draws one by hash from the rest.
        conn.execute(
            """CREATE TEMP TABLE bench_large_base AS
               SELECT org_id, sum(windows) OVER (ORDER BY org_id) - windows AS base
               FROM (SELECT org_id, sum(windows) AS windows FROM bench_keys WHERE large GROUP BY org_id) s"""
        )
        # (a window function cannot sit in a join condition: number the windows' vectors first)
        conn.execute(
            """CREATE TEMP TABLE bench_window_vector AS
               SELECT w.id,
                      CASE WHEN w.large
                           THEN (b.base + row_number() OVER (PARTITION BY w.org_id ORDER BY w.start, w.id) - 1)::int
                           ELSE %(pool_large)s + (('x' || substr(w.id::text, 1, 8))::bit(32)::int & 2147483647)
                                                 %% %(pool_small)s
                      END AS n
               FROM bench_windows w LEFT JOIN bench_large_base b ON b.org_id = w.org_id""",
            {"pool_large": POOL_LARGE, "pool_small": POOL - POOL_LARGE},
        )
        conn.execute(
            f"""INSERT INTO dw_message_embeddings (id, org_id, model, provider, external_channel_id, window_start,
                                                   window_end, embedding, content, source_message_ids)
                SELECT x.id, x.org_id, '{MODEL}', '{PROVIDER}', x.external_channel_id, x.window_start, x.window_end,
                       v.v,
                       (SELECT string_agg(s.text, E'\\n' ORDER BY j)
                        FROM generate_series(0, {MESSAGES_PER_WINDOW - 1}) AS j
                        JOIN bench_sentences s
                          ON s.n = bench_pick(x.org_id || '/' || x.external_channel_id || '/' || w.w || '/' || j)),
                       x.source_message_ids::text[]
                FROM dw_sweep_windows x
                JOIN bench_windows w ON w.id = x.id
                JOIN bench_window_vector n ON n.id = x.id
                JOIN bench_vectors v ON v.n = n.n
                ORDER BY x.window_start"""
        )
        timings["embeddings_s"] = time.perf_counter() - step
        log(f"  {spec.name}: embeddings in {timings['embeddings_s']:.0f}s")
        step = time.perf_counter()
        conn.execute(
            f"""INSERT INTO dw_sweep_watermarks (org_id, provider, external_channel_id, model, last_event_time,
                                                 last_event_id)
                SELECT k.org_id, '{PROVIDER}', k.channel, '{MODEL}', w.start + make_interval(mins => {MESSAGES_PER_WINDOW - 1}),
                       bench_uuid('e/' || k.org_id || '/' || k.channel || '/' || w.w || '/{MESSAGES_PER_WINDOW - 1}')
                FROM bench_keys k JOIN bench_windows w
                  ON w.org_id = k.org_id AND w.channel = k.channel AND w.w = k.windows - 1"""
        )
        conn.execute(
            """INSERT INTO org_feature_flags (org_id, flag_key, enabled)
               SELECT DISTINCT org_id, f, true FROM bench_keys, unnest(%s::text[]) AS f
               ON CONFLICT (org_id, flag_key) DO UPDATE SET enabled = true""",
            (["digital_worker", "digital_worker_semantic_search"],),
        )
        conn.execute(
            "UPDATE admin_feature_flags SET enabled = true WHERE flag_key = 'digital_worker_semantic_search'"
        )
        for _name, definition in indexes:
            conn.execute(definition)
        timings["indexes_s"] = time.perf_counter() - step
        log(f"  {spec.name}: watermarks, flags and indexes in {timings['indexes_s']:.0f}s")
        step = time.perf_counter()
        conn.execute("DROP TABLE bench_vectors, bench_sentences")
        conn.execute("VACUUM ANALYZE")
        timings["vacuum_s"] = time.perf_counter() - step
        conn.execute("CREATE TABLE bench_tenancy_population (spec text, built_at timestamptz DEFAULT now())")
        conn.execute("INSERT INTO bench_tenancy_population (spec) VALUES (%s)", (spec.as_json(),))
    timings["build_s"] = time.perf_counter() - t
    log(f"  {spec.name}: built in {timings['build_s']:.0f}s")
    return timings


def _drop_secondary_indexes(conn: psycopg.Connection) -> list[tuple[str, str]]:
    """Drop the bulk tables' secondary indexes; returns (name, definition) of each, to be
    built again after a load."""
    indexes = conn.execute(
        """SELECT indexname, indexdef FROM pg_indexes
           WHERE schemaname = current_schema()
             AND tablename IN ('dw_chat_events', 'dw_message_embeddings', 'dw_sweep_windows',
                               'dw_sweep_window_events')
             AND indexname NOT LIKE '%%_pkey'"""
    ).fetchall()
    for name, _ in indexes:
        conn.execute(f'DROP INDEX "{name}"')
    return indexes


# What copy_population copies, in this order (a table's foreign keys point up the list).
COPIED_TABLES = (
    "dw_chat_events",
    "dw_sweep_windows",
    "dw_sweep_window_events",
    "dw_message_embeddings",
    "dw_lexical_windows",
    "dw_lexical_terms",
    "dw_sweep_watermarks",
)


def copy_population(src_url: str, dst_url: str, spec: Spec, *, log=print) -> dict[str, float]:
    """Copy the population built at `src_url` into the (migrated, empty) database at
    `dst_url`, row for row (binary COPY, generated columns computed again there): the
    same orgs, events, windows, ledger, vectors and watermarks on another engine (a Citus
    coordinator routes each row to its org's shard). Returns timings."""
    timings: dict[str, float] = {}
    t = time.perf_counter()
    with psycopg.connect(src_url) as src, psycopg.connect(dst_url, autocommit=True) as dst:
        dst.execute("SET maintenance_work_mem = '1GB'")
        indexes = _drop_secondary_indexes(dst)
        for table in COPIED_TABLES:
            step = time.perf_counter()
            columns = ", ".join(
                name
                for (name,) in src.execute(
                    """SELECT column_name FROM information_schema.columns
                       WHERE table_schema = current_schema() AND table_name = %s AND is_generated = 'NEVER'
                       ORDER BY ordinal_position""",
                    (table,),
                )
            )
            with (
                src.cursor().copy(f"COPY (SELECT {columns} FROM {table}) TO STDOUT (FORMAT BINARY)") as out,
                dst.cursor().copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)") as into,
            ):
                for block in out:
                    into.write(block)
            timings[f"{table}_s"] = time.perf_counter() - step
            log(f"  {spec.name}: {table} copied in {timings[f'{table}_s']:.0f}s")
        flags = src.execute("SELECT org_id, flag_key, enabled FROM org_feature_flags").fetchall()
        with dst.cursor() as cur:
            cur.executemany(
                """INSERT INTO org_feature_flags (org_id, flag_key, enabled) VALUES (%s, %s, %s)
                   ON CONFLICT (org_id, flag_key) DO UPDATE SET enabled = excluded.enabled""",
                flags,
            )
        dst.execute(
            "UPDATE admin_feature_flags SET enabled = true WHERE flag_key = 'digital_worker_semantic_search'"
        )
        step = time.perf_counter()
        for _name, definition in indexes:
            dst.execute(definition)
        timings["indexes_s"] = time.perf_counter() - step
        # Named: Citus propagates a VACUUM of its tables to their shards, not a bare VACUUM.
        dst.execute(f"VACUUM ANALYZE {', '.join(COPIED_TABLES)}, org_feature_flags, admin_feature_flags")
        dst.execute("CREATE TABLE bench_tenancy_population (spec text, built_at timestamptz DEFAULT now())")
        dst.execute("INSERT INTO bench_tenancy_population (spec) VALUES (%s)", (spec.as_json(),))
    timings["copy_s"] = time.perf_counter() - t
    log(f"  {spec.name}: copied in {timings['copy_s']:.0f}s")
    return timings


# The Go module's events table hash-partitioned by org_id (bench.tenancy --sections
# partitioned): every partition its own GIN index on search_tsv, holding the postings of
# 1/PARTITIONS of the orgs. Built once beside the table and swapped in by name for the run.
PARTITIONS = 16
_EVENT_COLUMNS = "id, org_id, provider, external_channel_id, event_type, decision, message_text, created_at"


def _relkind(conn: psycopg.Connection, name: str) -> str | None:
    row = conn.execute(
        "SELECT relkind FROM pg_class WHERE relname = %s AND relnamespace = current_schema()::regnamespace",
        (name,),
    ).fetchone()
    return row[0] if row else None


def use_partitioned_events(url: str, partitions: int = PARTITIONS, *, log=print) -> None:
    """Make dw_chat_events the hash-partitioned copy (built the first time), the plain
    table kept as dw_chat_events_flat."""
    with psycopg.connect(url, autocommit=True) as conn:
        if _relkind(conn, "dw_chat_events") == "p":
            return
        if _relkind(conn, "dw_chat_events_part") is None:
            start = time.perf_counter()
            conn.execute("SET maintenance_work_mem = '1GB'")
            conn.execute(
                "CREATE TABLE dw_chat_events_part (LIKE dw_chat_events INCLUDING DEFAULTS INCLUDING GENERATED)"
                " PARTITION BY HASH (org_id)"
            )
            for i in range(partitions):
                conn.execute(
                    f"CREATE TABLE dw_chat_events_part_{i} PARTITION OF dw_chat_events_part"
                    f" FOR VALUES WITH (MODULUS {partitions}, REMAINDER {i})"
                )
            conn.execute(
                f"INSERT INTO dw_chat_events_part ({_EVENT_COLUMNS}) SELECT {_EVENT_COLUMNS} FROM dw_chat_events"
                " ORDER BY created_at"
            )
            # A partitioned table's unique keys include its partition key.
            conn.execute("ALTER TABLE dw_chat_events_part ADD PRIMARY KEY (org_id, id)")
            conn.execute(
                "CREATE INDEX dw_chat_events_part_search_tsv_idx ON dw_chat_events_part USING gin (search_tsv)"
            )
            conn.execute(
                "CREATE INDEX dw_chat_events_part_scope_idx"
                " ON dw_chat_events_part (org_id, provider, external_channel_id, created_at, id)"
            )
            conn.execute("VACUUM ANALYZE dw_chat_events_part")
            log(f"  events partitioned in {partitions} in {time.perf_counter() - start:.0f}s")
        with conn.transaction():
            conn.execute("ALTER TABLE dw_chat_events RENAME TO dw_chat_events_flat")
            conn.execute("ALTER TABLE dw_chat_events_part RENAME TO dw_chat_events_part_tmp")
            conn.execute("ALTER TABLE dw_chat_events_part_tmp RENAME TO dw_chat_events")


def use_flat_events(url: str) -> None:
    """Undo use_partitioned_events: the plain table is dw_chat_events again."""
    with psycopg.connect(url, autocommit=True) as conn:
        if _relkind(conn, "dw_chat_events") != "p":
            return
        with conn.transaction():
            conn.execute("ALTER TABLE dw_chat_events RENAME TO dw_chat_events_part")
            conn.execute("ALTER TABLE dw_chat_events_flat RENAME TO dw_chat_events")
