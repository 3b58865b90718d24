"""The soak's workload, seeded and rate-controlled, each part a thread that records what it
did and how it was answered in the History:

- ingest: the Go module's inserts into dw_chat_events, straight into Postgres: English,
  Malay, Chinese and rojak support sessions (bench.sweep_load's), each on a new channel
  (a new customer) or a returning customer's key, some longer than a window; denied and
  verification events that must never be embedded; an org whose flags are off. Some
  messages carry a planted word (`zq` + a number), unique, so a search for it finds that
  message only;
- sweep: `dwsearch sweep` against each serve every period, as the CronJob runs it (a
  call still running skips its turn, concurrencyPolicy: Forbid);
- search: Search (hybrid, full text, semantic; some reranked, some explained) and Similar
  on both replicas;
- agent contexts: the support app's three parallel filtered REST queries, and upserts;
- forget: a planted message edited or deleted, then SweepService.Forget; purge: a
  retention purge of an org (the Go module's DELETE, then `dwsearch purge`); each gone
  word is probed by searches once its call returned and the standby replayed it;
- knn-indexes: `dwsearch knn-indexes` every few minutes, so the largest org crosses
  its threshold during the run;
- the sampler: RSS and descriptors of every process, Postgres connections and locks.

Outcomes: `full`, `degraded` (with its reason), `rejected` (an answer to the request
itself: NOT_FOUND and the like), `unavailable` (UNAVAILABLE / RESOURCE_EXHAUSTED, REST
503), `internal` (INTERNAL, UNKNOWN, REST 500) and `hung` (no answer within the client's
deadline)."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from bench.soak.stack import REST_TOKEN, Stack
from bench.sweep_load import CLOSINGS, QUERIES, fill, session
from dwsearch.flags import MODULE_FLAG, SEMANTIC_SEARCH_FLAG
from dwsearch.v1 import search_pb2, search_pb2_grpc, sweep_pb2, sweep_pb2_grpc
from dwsearch_testkit.procs import base_env
from dwsearch_testkit.seed import enable_semantic_search

PROVIDER = "whatsapp"
CLIENT_DEADLINE_S = 10.0  # a request unanswered after this long is `hung`
OFF_ORG = "soak-flags-off"
APPS = [f"app-{i}" for i in range(6)]
SEED_FILTERS = (
    "appId = '{app}' AND type = 'conversation' AND resolution != 'escalated'",
    "appId = '{app}' AND type = 'knowledge'",
    "appId = '{app}' AND type = 'response' AND trustScore > 0.85",
)
REJECTED = {
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
}
UNAVAILABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED}


@dataclass(frozen=True)
class Profile:
    """Sizes and rates of a run."""

    orgs: int
    channels: int
    history_sessions: int
    ingest_per_s: float
    searchers: int
    search_pause_s: float
    rest_pause_s: float
    sweep_period_s: float
    forget_period_s: float
    purge_period_s: float
    knn_period_s: float
    knn_margin: int  # windows above the largest org's count at the first run
    sample_period_s: float


QUICK = Profile(orgs=5, channels=3, history_sessions=4, ingest_per_s=2.0, searchers=2, search_pause_s=0.4,
                rest_pause_s=1.5, sweep_period_s=20, forget_period_s=8, purge_period_s=45, knn_period_s=60,
                knn_margin=3, sample_period_s=2)  # fmt: skip
FULL = Profile(orgs=12, channels=4, history_sessions=8, ingest_per_s=2.0, searchers=3, search_pause_s=0.5,
               rest_pause_s=2.0, sweep_period_s=60, forget_period_s=20, purge_period_s=180, knn_period_s=300,
               knn_margin=12, sample_period_s=5)  # fmt: skip


class History:
    """Every record of the run, in memory (a few hundred thousand at most) and, at the
    end, in a JSON-lines file. `t`: seconds since the run's start."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.wall_started = time.time()
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.started

    def add(self, **record: Any) -> dict[str, Any]:
        record.setdefault("t", round(self.now(), 3))
        with self._lock:
            self.records.append(record)
        return record

    def of(self, *ops: str) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.records if r.get("op") in ops]

    def dump(self, path: Any) -> None:
        with self._lock, open(path, "w") as out:
            for record in self.records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")


@dataclass
class Ledger:
    """What the workload wrote: every event's org (cross-org checks), the planted words,
    and the gone ones (edited, deleted or purged; `gone_at`: when probes may start)."""

    org_of: dict[str, str] = field(default_factory=dict)
    planted: dict[str, tuple[str, str]] = field(default_factory=dict)  # word -> (org, event id)
    gone: dict[str, dict[str, Any]] = field(default_factory=dict)  # word -> {org, how, gone_at}
    by_org: dict[str, list[str]] = field(default_factory=dict)  # eligible event ids, for Similar
    recent_words: dict[str, list[str]] = field(default_factory=dict)  # org -> words of its live chat
    lock: threading.Lock = field(default_factory=threading.Lock)
    counter: int = 0

    def word(self) -> str:
        with self.lock:
            self.counter += 1
            return f"zq{self.counter:05d}x"


def orgs_of(profile: Profile) -> list[str]:
    return [f"soak-{i:02d}" for i in range(profile.orgs)]


def _kind(rng: random.Random) -> tuple[str, str]:
    """(event_type, decision) of one event: mostly eligible messages."""
    roll = rng.random()
    if roll < 0.04:
        return "message", "denied"
    if roll < 0.06:
        return "verification", "processed"
    return "message", rng.choice(("received", "received", "processed"))


class Workload:
    def __init__(self, stack: Stack, profile: Profile, history: History, seed: int, minutes: float) -> None:
        self.stack = stack
        self.profile = profile
        self.history = history
        self.seed = seed
        self.duration_s = minutes * 60
        self.ledger = Ledger()
        self.orgs = orgs_of(profile)
        self.stop = threading.Event()  # the load (everything but the sweep)
        self.stop_sweeps = threading.Event()
        self.threads: list[threading.Thread] = []
        self.channels: dict[str, grpc.Channel] = {}
        self.sweeping: dict[str, bool] = {}
        self.last_backlog: dict[str, int] = {}
        self.knn_threshold: int | None = None

    # --- seeding ---------------------------------------------------------------------------

    def seed_history(self) -> int:
        """Closed sessions over the last two days for every key (a deployment turned on
        over an existing table), the largest org with three times as many; the flags on
        for every org but OFF_ORG. Returns the events written."""
        rng = random.Random(self.seed)
        enable_semantic_search(self.stack.primary_url, *self.orgs)
        with psycopg.connect(self.stack.primary_url, autocommit=True) as conn:
            conn.execute(
                """INSERT INTO org_feature_flags (org_id, flag_key, enabled) VALUES (%s, %s, true), (%s, %s, false)
                   ON CONFLICT (org_id, flag_key) DO NOTHING""",
                (OFF_ORG, MODULE_FLAG, OFF_ORG, SEMANTIC_SEARCH_FLAG),
            )
        now = datetime.now(UTC)
        rows = []
        for org in [*self.orgs, OFF_ORG]:
            sessions = self.profile.history_sessions * (3 if org == self.orgs[0] else 1)
            for c in range(self.profile.channels):
                channel = f"h{c}"
                at = now - timedelta(hours=46)
                for _ in range(sessions):
                    lines = session(rng)
                    if rng.random() < 0.25:  # a long conversation: more than one window
                        lines += session(rng)
                    for line in lines:
                        rows.append(self._row(rng, org, channel, line, at))
                        at += timedelta(minutes=rng.uniform(0.5, 3))
                    at += timedelta(hours=rng.uniform(1, 40 / sessions))
                    at = min(at, now - timedelta(hours=2))
        copy_in = (
            "COPY dw_chat_events (id, org_id, provider, external_channel_id, event_type, decision,"
            " message_text, created_at) FROM STDIN"
        )
        with (
            psycopg.connect(self.stack.primary_url, autocommit=True) as conn,
            conn.cursor() as cur,
            cur.copy(copy_in) as copy,
        ):
            for row in rows:
                copy.write_row(row)
        return len(rows)

    def _row(self, rng: random.Random, org: str, channel: str, text: str, at: datetime) -> tuple:
        event_type, decision = _kind(rng)
        event_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if rng.random() < 0.08:
            word = self.ledger.word()
            text = f"{text} (ref {word})"
            self.ledger.planted[word] = (org, event_id)
        with self.ledger.lock:
            self.ledger.org_of[event_id] = org
            if event_type == "message" and decision != "denied":
                self.ledger.by_org.setdefault(org, []).append(event_id)
        return (event_id, org, PROVIDER, channel, event_type, decision, text, at)

    def seed_documents(self) -> None:
        """Each app's knowledge articles, resolved conversations and trusted responses."""
        rng = random.Random(self.seed + 1)
        for app in APPS:
            documents = [self._document(rng, app, i) for i in range(12)]
            status, _, body = self.rest("a", "upsert-data", documents)
            assert status == 200, (status, body)

    def _document(self, rng: random.Random, app: str, i: int) -> dict[str, Any]:
        kind = ("conversation", "knowledge", "response")[i % 3]
        metadata: dict[str, Any] = {"appId": app, "type": kind}
        if kind == "conversation":
            metadata["resolution"] = rng.choice(("resolved", "resolved", "escalated"))
        if kind == "response":
            metadata["trustScore"] = round(rng.uniform(0.6, 1.0), 2)
        return {"id": f"{app}-{kind}-{i}-{rng.getrandbits(32):x}", "data": " ".join(session(rng)[:3]),
                "metadata": metadata}  # fmt: skip

    # --- the threads ---------------------------------------------------------------------------

    def start(self) -> None:
        parts: list[tuple[str, Callable[[random.Random], None]]] = [
            ("ingest", self._ingest),
            ("sweep", self._sweeps),
            ("rest", self._rest_contexts),
            ("forget", self._forgets),
            ("purge", self._purges),
            ("knn", self._knn_indexes),
            ("probe", self._probes),
        ] + [(f"search-{i}", self._searches) for i in range(self.profile.searchers)]
        for i, (name, target) in enumerate(parts):
            rng = random.Random(self.seed * 1000 + i)
            thread = threading.Thread(target=self._guard, args=(name, target, rng), name=name, daemon=True)
            self.threads.append(thread)
            thread.start()

    def _guard(self, name: str, target: Callable[[random.Random], None], rng: random.Random) -> None:
        try:
            target(rng)
        except Exception as exc:  # a bug of the harness: recorded, and the checker fails on it
            import traceback

            self.history.add(op="harness", part=name, error=f"{exc!r}", trace=traceback.format_exc()[-2000:])

    def join(self) -> None:
        self.stop.set()
        self.stop_sweeps.set()
        for thread in self.threads:
            thread.join(120)

    def _pause(self, seconds: float, until: threading.Event | None = None) -> bool:
        """Sleep; False once the load is to stop."""
        return not (until or self.stop).wait(seconds)

    def channel(self, serve: str) -> grpc.Channel:
        address = self.stack.serves[serve].address
        key = f"{serve}@{address}"
        if key not in self.channels:
            self.channels[key] = grpc.insecure_channel(address)
        return self.channels[key]

    # ingest ---------------------------------------------------------------------------------

    def _ingest(self, rng: random.Random) -> None:
        live: list[list[Any]] = []  # [org, channel, lines left]
        rested: dict[tuple[str, str], float] = {}  # returning customers' keys: free from then
        conn: psycopg.Connection | None = None
        n = 0
        while self._pause(rng.expovariate(self.profile.ingest_per_s)):
            while len(live) < 6:
                # The largest org (never purged: its retention is long) gets a third of the
                # new chat, so it crosses the knn-indexes threshold during the run.
                org = self.orgs[0] if rng.random() < 0.3 else rng.choice([*self.orgs, *self.orgs, OFF_ORG])
                channel = f"h{rng.randrange(self.profile.channels)}"
                if rng.random() < 0.7 or rested.get((org, channel), 0) > self.history.now():
                    n += 1
                    channel = f"live{n}"
                lines = session(rng) + (session(rng) if rng.random() < 0.35 else [])
                live.append([org, channel, lines])
            current = rng.choice(live)
            org, channel, lines = current
            text = lines.pop(0)
            if not lines:
                live.remove(current)
                rested[(org, channel)] = self.history.now() + 32 * 60
            event_type, decision = _kind(rng)
            event_id = str(uuid.uuid4())
            word = None
            if rng.random() < 0.1:
                word = self.ledger.word()
                text = f"{text} (ref {word})"
            with self.ledger.lock:
                self.ledger.org_of[event_id] = org
            started = time.monotonic()
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.stack.primary_url, autocommit=True, connect_timeout=5)
                conn.execute(
                    """INSERT INTO dw_chat_events (id, org_id, provider, external_channel_id, event_type,
                                                   decision, message_text) VALUES (%s, %s, %s, %s, %s, %s, %s)""",
                    (event_id, org, PROVIDER, channel, event_type, decision, text),
                )
            except psycopg.Error as exc:
                self.history.add(op="ingest", outcome="unavailable", reason=type(exc).__name__,
                                 ms=(time.monotonic() - started) * 1000)  # fmt: skip
                if conn is not None:
                    conn.close()
                conn = None
                continue
            with self.ledger.lock:
                if word:
                    self.ledger.planted[word] = (org, event_id)
                if event_type == "message" and decision != "denied":
                    self.ledger.by_org.setdefault(org, []).append(event_id)
                    words = [w for w in re.findall(r"\w{4,}", text) if not w.startswith("zq")]
                    self.ledger.recent_words.setdefault(org, []).extend(words[:3])
                    del self.ledger.recent_words[org][:-50]
            self.history.add(op="ingest", outcome="full", ms=(time.monotonic() - started) * 1000)
        if conn is not None:
            conn.close()

    # sweep ----------------------------------------------------------------------------------

    def _sweeps(self, rng: random.Random) -> None:
        pool = ThreadPoolExecutor(3)
        while True:
            for serve in list(self.stack.serves):
                if not self.sweeping.get(serve):
                    self.sweeping[serve] = True
                    pool.submit(self._sweep_once, serve)
            if not self._pause(self.profile.sweep_period_s, self.stop_sweeps):
                break
        pool.shutdown(wait=True)

    def _sweep_once(self, serve: str) -> dict[str, Any]:
        try:
            return self.sweep(serve)
        finally:
            self.sweeping[serve] = False

    def sweep(self, serve: str) -> dict[str, Any]:
        """`dwsearch sweep` against one serve, as the CronJob runs it; its summary parsed."""
        started = time.monotonic()
        t = self.history.now()
        done = subprocess.run(
            [sys.executable, "-m", "dwsearch.cli", "sweep", "--no-progress",
             "--server-addr", self.stack.serves[serve].address, "--timeout-seconds", "1800"],
            env=base_env(), capture_output=True, text=True, timeout=1900,
        )  # fmt: skip
        numbers = {
            name: int(m.group(1)) if (m := re.search(pattern, done.stdout)) else 0
            for name, pattern in (
                ("embedded", r"(\d+) windows embedded"),
                ("skipped", r"(\d+) skipped"),
                ("poisoned", r"(\d+) poisoned"),
                ("pending", r"of (\d+) pending events"),
                ("stalled", r"(\d+) stalled"),
                ("locked", r"(\d+) left to another sweeper"),
                ("dropped", r"(\d+) windows dropped"),
            )
        }
        self.last_backlog[serve] = numbers["pending"]
        error = (done.stderr.strip().splitlines() or [""])[-1][:300] if done.returncode else ""
        return self.history.add(op="sweep", t=round(t, 3), serve=serve, rc=done.returncode, error=error,
                                ms=(time.monotonic() - started) * 1000, **numbers)  # fmt: skip

    # search ---------------------------------------------------------------------------------

    def _searches(self, rng: random.Random) -> None:
        queries = [fill(rng.choice(QUERIES), rng) for _ in range(200)]
        while self._pause(rng.expovariate(1 / self.profile.search_pause_s)):
            serve = rng.choice(("a", "b"))
            org = rng.choice(self.orgs)
            if rng.random() < 0.12:
                self._similar(rng, serve, org)
                continue
            with self.ledger.lock:
                recent = list(self.ledger.recent_words.get(org, []))
            query = rng.choice(recent) if recent and rng.random() < 0.3 else rng.choice(queries)
            mode = rng.choices(
                (search_pb2.SEARCH_MODE_HYBRID, search_pb2.SEARCH_MODE_FTS, search_pb2.SEARCH_MODE_SEMANTIC),
                (5, 2, 3),
            )[0]
            request = search_pb2.SearchRequest(org_id=org, query=query, limit=10, mode=mode,
                                               explain=rng.random() < 0.1)  # fmt: skip
            if rng.random() < 0.2:
                request.rerank = True
            self.search(serve, request, op="search")

    def search(self, serve: str, request: search_pb2.SearchRequest, op: str, **extra: Any) -> Any:
        stub = search_pb2_grpc.SearchServiceStub(self.channel(serve))
        mode = search_pb2.SearchMode.Name(request.mode).removeprefix("SEARCH_MODE_").lower()
        started = time.monotonic()
        t = self.history.now()
        try:
            response = stub.Search(request, timeout=CLIENT_DEADLINE_S)
        except grpc.RpcError as exc:
            self._failed(op, serve, t, started, exc, mode=mode, **extra)
            return None
        self._answered(op, serve, t, started, request.org_id, response, mode=mode,
                       rerank=request.HasField("rerank"), **extra)  # fmt: skip
        return response

    def _similar(self, rng: random.Random, serve: str, org: str) -> None:
        with self.ledger.lock:
            ids = self.ledger.by_org.get(org) or []
            message_id = rng.choice(ids) if ids else str(uuid.uuid4())
        stub = search_pb2_grpc.SearchServiceStub(self.channel(serve))
        started = time.monotonic()
        t = self.history.now()
        try:
            response = stub.Similar(
                search_pb2.SimilarRequest(org_id=org, message_id=message_id, limit=5),
                timeout=CLIENT_DEADLINE_S,
            )
        except grpc.RpcError as exc:
            self._failed("similar", serve, t, started, exc)
            return
        self._answered("similar", serve, t, started, org, response)

    def _failed(
        self, op: str, serve: str, t: float, started: float, exc: grpc.RpcError, **extra: Any
    ) -> None:
        code = exc.code()  # type: ignore[attr-defined]
        if time.monotonic() - started >= CLIENT_DEADLINE_S * 0.95:
            outcome = "hung"
        elif code in REJECTED:
            outcome = "rejected"
        elif code in UNAVAILABLE or code == grpc.StatusCode.DEADLINE_EXCEEDED:  # a dependency's deadline
            outcome = "unavailable"
        else:
            outcome = "internal"
        self.history.add(op=op, t=round(t, 3), serve=serve, outcome=outcome, reason=code.name,
                         detail=(exc.details() or "")[:200], ms=(time.monotonic() - started) * 1000,  # type: ignore[attr-defined]
                         **extra)  # fmt: skip

    def _answered(
        self, op: str, serve: str, t: float, started: float, org: str, response: Any, **extra: Any
    ) -> None:
        ms = (time.monotonic() - started) * 1000
        foreign = []
        with self.ledger.lock:
            for hit in response.hits:
                owners = {self.ledger.org_of.get(i, "?") for i in hit.message_ids}
                if owners - {org}:
                    foreign.append({"hit": hit.id, "owners": sorted(owners)})
        reasons = sorted(
            search_pb2.DegradationReason.Name(d.reason).removeprefix("DEGRADATION_REASON_").lower()
            for d in getattr(response, "degradations", [])
        )
        degraded = bool(getattr(response, "degraded", False))
        self.history.add(op=op, t=round(t, 3), serve=serve, outcome="degraded" if degraded else "full",
                         reason=",".join(reasons), ms=ms, hits=len(response.hits), foreign=foreign or None,
                         **extra)  # fmt: skip

    # agent contexts -------------------------------------------------------------------------

    def rest(self, serve: str, endpoint: str, body: Any) -> tuple[int, dict[str, str], Any]:
        port = self.stack.rest_ports[serve]
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/support/{endpoint}",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {REST_TOKEN}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=CLIENT_DEADLINE_S) as response:
                headers = {k.lower(): v for k, v in response.headers.items()}
                return response.status, headers, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            headers = {k.lower(): v for k, v in exc.headers.items()}
            try:
                payload = json.loads(exc.read() or b"null")
            except ValueError:
                payload = None
            return exc.code, headers, payload
        except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            return (-1 if "timed out" in str(reason) else 0), {}, str(reason)

    def _rest_contexts(self, rng: random.Random) -> None:
        pool = ThreadPoolExecutor(3)
        doc = 1000
        while self._pause(rng.expovariate(1 / self.profile.rest_pause_s)):
            serve = rng.choice(("a", "b"))
            app = rng.choice(APPS)
            if rng.random() < 0.15:
                doc += 1
                started = time.monotonic()
                t = self.history.now()
                status, _, body = self.rest(serve, "upsert-data", [self._document(rng, app, doc)])
                self._rest_record("upsert", serve, t, started, status, {}, body, app)
                continue
            message = fill(rng.choice(QUERIES), rng) if rng.random() < 0.7 else rng.choice(CLOSINGS)

            def query(template: str, serve: str = serve, app: str = app, message: str = message) -> None:
                started = time.monotonic()
                t = self.history.now()
                status, headers, body = self.rest(serve, "query-data", {
                    "data": message, "topK": 3, "includeMetadata": True, "filter": template.format(app=app)})  # fmt: skip
                self._rest_record("context", serve, t, started, status, headers, body, app)

            list(pool.map(query, SEED_FILTERS))
        pool.shutdown()

    def _rest_record(self, op: str, serve: str, t: float, started: float, status: int,
                     headers: dict[str, str], body: Any, app: str) -> None:  # fmt: skip
        ms = (time.monotonic() - started) * 1000
        foreign = None
        if status == 200 and op == "context":
            foreign = [
                h["id"] for h in body.get("result", []) if (h.get("metadata") or {}).get("appId") != app
            ] or None
        if status == 200:
            outcome = "degraded" if headers.get("dwsearch-degraded") else "full"
        elif status == -1:
            outcome = "hung"
        elif status in (0, 502, 503, 504, 429):  # 504: a dependency's deadline (DEADLINE_EXCEEDED)
            outcome = "unavailable"
        elif 400 <= status < 500:
            outcome = "rejected"
        else:
            outcome = "internal"
        self.history.add(op=op, t=round(t, 3), serve=serve, outcome=outcome, ms=ms, status=status,
                         reason=headers.get("dwsearch-degraded", "") if status == 200 else str(body)[:200],
                         foreign=foreign)  # fmt: skip

    # forget and purge -----------------------------------------------------------------------

    def _forgets(self, rng: random.Random) -> None:
        while self._pause(self.profile.forget_period_s):
            with self.ledger.lock:
                candidates = [
                    (w, org, eid) for w, (org, eid) in self.ledger.planted.items()
                    if w not in self.ledger.gone and org != OFF_ORG
                ]  # fmt: skip
            if not candidates:
                continue
            word, org, event_id = rng.choice(candidates[-200:])
            how = rng.choice(("edit", "delete"))
            if not self._go_write(how, word, event_id):
                continue
            self._call_until_done(
                "forget", org, word, how,
                lambda serve, org=org, event_id=event_id: sweep_pb2_grpc.SweepServiceStub(self.channel(serve)).Forget(
                    sweep_pb2.ForgetRequest(org_id=org, message_ids=[event_id]), timeout=30),
            )  # fmt: skip

    def _go_write(self, how: str, word: str, event_id: str) -> bool:
        """The Go module's edit (the word taken out) or deletion, committed."""
        try:
            with psycopg.connect(self.stack.primary_url, autocommit=True, connect_timeout=5) as conn:
                if how == "delete":
                    conn.execute("DELETE FROM dw_chat_events WHERE id = %s", (event_id,))
                    self._forget_ids({event_id})
                else:
                    conn.execute(
                        "UPDATE dw_chat_events SET message_text = replace(message_text, %s, 'edited') WHERE id = %s",
                        (word, event_id),
                    )
        except psycopg.Error as exc:
            self.history.add(op="go-write", outcome="unavailable", reason=type(exc).__name__)
            return False
        return True

    def _call_until_done(
        self, op: str, org: str, word: str | list[str], how: str, call: Callable[[str], Any]
    ) -> None:
        """The Go module's retry: the call until it returns, then the words are gone."""
        words = [word] if isinstance(word, str) else word
        for attempt in range(60):
            serve = ("a", "b")[attempt % 2]
            started = time.monotonic()
            t = self.history.now()
            try:
                call(serve)
            except grpc.RpcError as exc:
                self._failed(op, serve, t, started, exc, attempt=attempt)
                time.sleep(2)
                continue
            self.history.add(op=op, t=round(t, 3), serve=serve, outcome="full", ms=(time.monotonic() - started) * 1000,
                             words=len(words), how=how)  # fmt: skip
            self._gone(org, words, how)
            return
        self.history.add(op="harness", error=f"{op} of {org} never returned")

    def _gone(self, org: str, words: list[str], how: str) -> None:
        returned = self.history.now()
        try:
            waited = self.stack.wait_replayed(30)
        except (TimeoutError, psycopg.Error):
            waited = -1.0  # the standby is down: reads are on the primary
        gone_at = self.history.now()
        with self.ledger.lock:
            for word in words:
                self.ledger.gone[word] = {"org": org, "how": how, "returned": returned, "gone_at": gone_at}
        self.history.add(op="gone", how=how, org=org, words=len(words), replay_wait_s=round(waited, 3))
        for word in words[:3]:
            self.probe(word)

    def _purges(self, rng: random.Random) -> None:
        turn = 0
        while self._pause(self.profile.purge_period_s):
            org = self.orgs[1 + turn % (len(self.orgs) - 1)]  # not the largest org: see _ingest
            turn += 1
            progress = min(1.0, self.history.now() / self.duration_s)
            cutoff = datetime.now(UTC) - timedelta(hours=40 - 34 * progress)  # retention shrinks to 6 h
            try:
                with psycopg.connect(self.stack.primary_url, autocommit=True, connect_timeout=5) as conn:
                    rows = conn.execute(
                        "DELETE FROM dw_chat_events WHERE org_id = %s AND created_at < %s RETURNING id::text",
                        (org, cutoff),
                    ).fetchall()
            except psycopg.Error as exc:
                self.history.add(op="go-write", outcome="unavailable", reason=type(exc).__name__)
                continue
            deleted = {r[0] for r in rows}
            self._forget_ids(deleted)
            with self.ledger.lock:
                words = [w for w, (o, eid) in self.ledger.planted.items() if o == org and eid in deleted]
            self._call_until_done(
                "purge", org, words, "purge",
                lambda serve, org=org, cutoff=cutoff: self._purge_cli(serve, org, cutoff),
            )  # fmt: skip

    def _forget_ids(self, deleted: set[str]) -> None:
        """Similar's anchors: only messages that still exist."""
        with self.ledger.lock:
            for org, ids in self.ledger.by_org.items():
                self.ledger.by_org[org] = [i for i in ids if i not in deleted]

    def _purge_cli(self, serve: str, org: str, cutoff: datetime) -> None:
        """`dwsearch purge`, as the retention CronJob runs it."""
        done = subprocess.run(
            [sys.executable, "-m", "dwsearch.cli", "purge", "--org-id", org, "--cutoff", cutoff.isoformat(),
             "--server-addr", self.stack.serves[serve].address, "--timeout-seconds", "60"],
            env=base_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if done.returncode != 0:
            raise _CliError(done.stderr.strip()[-300:])

    # probes -------------------------------------------------------------------------------

    def probe(self, word: str) -> None:
        """Search for a gone word on both replicas, full text and hybrid: any hit whose
        text holds it is a finding."""
        info = self.ledger.gone[word]
        for serve in ("a", "b"):
            for mode in (search_pb2.SEARCH_MODE_FTS, search_pb2.SEARCH_MODE_HYBRID):
                request = search_pb2.SearchRequest(org_id=info["org"], query=word, limit=10, mode=mode)
                started_at = self.history.now()
                response = self.search(serve, request, op="probe", word=word)
                if response is None:
                    continue
                found = [h.id for h in response.hits if word in h.text]
                if found:
                    self.history.add(op="found", word=word, serve=serve, started=round(started_at, 3),
                                     gone_at=info["gone_at"], how=info["how"], hits=found)  # fmt: skip

    def _probes(self, rng: random.Random) -> None:
        while self._pause(3.0):
            with self.ledger.lock:
                words = list(self.ledger.gone)
            for word in rng.sample(words, min(2, len(words))):
                self.probe(word)

    # knn-indexes ----------------------------------------------------------------------------

    def _knn_indexes(self, rng: random.Random) -> None:
        while self._pause(self.profile.knn_period_s):
            self.knn_indexes()

    def knn_indexes(self) -> None:
        """`dwsearch knn-indexes` with a threshold a few windows above the largest org's
        count at its first run, so an org crosses it while the run goes on."""
        if self.knn_threshold is None:
            try:
                with psycopg.connect(self.stack.primary_url, connect_timeout=5) as conn:
                    row = conn.execute(
                        """SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM dw_message_embeddings
                           WHERE model = %s GROUP BY org_id) o""",
                        (self.stack.model_a,),
                    ).fetchone()
            except psycopg.Error:
                return
            self.knn_threshold = int(row[0] if row else 0) + self.profile.knn_margin
        started = time.monotonic()
        t = self.history.now()
        done = subprocess.run(
            [sys.executable, "-m", "dwsearch.cli", "knn-indexes", "--min-windows", str(self.knn_threshold)],
            env=base_env(DWSEARCH_DATABASE_URL=self.stack.primary_url, DWSEARCH_EMBED_MODEL=self.stack.model_a),
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        self.history.add(op="knn", t=round(t, 3), rc=done.returncode, min_windows=self.knn_threshold, ms=(time.monotonic() - started) * 1000,
                         out=(done.stdout + done.stderr).strip()[-400:])  # fmt: skip

    # sampler --------------------------------------------------------------------------------

    def sample_forever(self) -> threading.Thread:
        def run() -> None:
            while not self.stop_sweeps.wait(self.profile.sample_period_s):
                self.sample()

        thread = threading.Thread(target=run, name="sampler", daemon=True)
        thread.start()
        return thread

    def sample(self) -> None:
        # The machine's CPU as /proc/stat counts it (jiffies since boot): the checker turns
        # it into cores per phase, so a run that shared its cores with other jobs (niced, as
        # builds and tests are, or a neighbour's steal) says so beside its latency.
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:9]]
        user, nice, system, idle, iowait, irq, softirq, steal = fields
        self.history.add(op="cpu", busy=user + system + irq + softirq, nice=nice, steal=steal,
                         idle=idle + iowait, hz=os.sysconf("SC_CLK_TCK"))  # fmt: skip
        for name, pid in self.stack.pids().items():
            try:
                with open(f"/proc/{pid}/status") as status:
                    rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
                fds = len(os.listdir(f"/proc/{pid}/fd"))
            except (OSError, StopIteration):
                continue
            extra: dict[str, Any] = {}
            if name.startswith("serve-"):
                cache = query_cache_bytes(self.stack.metrics_ports.get(name[len("serve-") :]))
                if cache is not None:
                    extra["query_cache_mib"] = round(cache / 2**20, 3)
            self.history.add(op="sample", proc=name, pid=pid, rss_mib=round(rss / 1024, 2), fds=fds, **extra)
        try:
            with psycopg.connect(self.stack.primary_url, autocommit=True, connect_timeout=3) as conn:
                row = conn.execute(
                    """SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
                              (SELECT count(*) FROM pg_locks),
                              (SELECT count(*) FROM pg_locks WHERE NOT granted)"""
                ).fetchone()
                by_app = dict(
                    conn.execute(
                        """SELECT coalesce(nullif(application_name, ''), '(none)'), count(*) FROM pg_stat_activity
                           WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() GROUP BY 1"""
                    ).fetchall()
                )
            assert row is not None
            backlog = sum(self.last_backlog.get(s, 0) for s in ("a", "b")) // 2
            self.history.add(op="db", connections=row[0] - 1, locks=row[1], waiting=row[2], backlog=backlog,
                             by_app=by_app, serves=len(self.stack.pids_of_serves()))  # fmt: skip
        except psycopg.Error:
            self.history.add(op="db", connections=None)


def query_cache_bytes(port: int | None) -> float | None:
    """dwsearch_query_cache_bytes from a serve's /metrics; None when it does not answer."""
    if port is None:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == "dwsearch_query_cache_bytes":
            return sum(sample.value for sample in family.samples)
    return None


class _CliError(grpc.RpcError):
    """A CLI call that failed, shaped as an RPC error for the retry loop."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def code(self) -> grpc.StatusCode:
        for code in grpc.StatusCode:
            if code.name in self.text:
                return code
        return grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return self.text
