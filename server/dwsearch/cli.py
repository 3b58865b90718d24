"""The `dwsearch` command. Every flag has a DWSEARCH_* environment variable (flags win);
`dwsearch <command> --help` lists them."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dwsearch.common import config as cfgmod
from dwsearch.common import logging as logmod
from dwsearch.common import tracing


def _add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        typ = hints[f.name]
        helptext = f"{f.metadata.get('help', '')} [env {cfgmod.env_name(f.name)}]"
        if f.metadata.get("secret"):
            helptext += " (secret)"
        else:
            helptext += f" (default: {f.default})"
        if typ is bool:
            parser.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=helptext
            )
        else:
            conv: Callable[[str], Any] = {int: int, float: float, Path: Path}.get(typ, str)
            choices = f.metadata.get("choices") or None
            parser.add_argument(flag, dest=f.name, type=conv, default=None, help=helptext, choices=choices)


def _config(cls: type, args: argparse.Namespace) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cfgmod.load(cls, {k: v for k, v in vars(args).items() if k in names})


def _setup_logging(cfg: Any) -> None:
    logmod.configure(cfg.log_level, cfg.log_format)
    for name in cfgmod.unknown_variables():
        logging.getLogger("dwsearch.cli").warning(
            "%s is no dwsearch setting (misspelt?); ignored", name, extra={"variable": name}
        )


# --- commands -------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = _config(cfgmod.ServerConfig, args)
    _setup_logging(cfg)
    tracing.configure("serve", sql=True)  # on when OTEL_EXPORTER_OTLP_ENDPOINT is set
    from dwsearch.serve import run_serve

    asyncio.run(run_serve(cfg))
    return 0


def cmd_embedder(args: argparse.Namespace) -> int:
    cfg = _config(cfgmod.EmbedderConfig, args)
    _setup_logging(cfg)
    tracing.configure("embedder")
    from dwsearch_embedder.main import run_embedder

    asyncio.run(run_embedder(cfg))
    return 0


def cmd_reranker(args: argparse.Namespace) -> int:
    cfg = _config(cfgmod.RerankerConfig, args)
    _setup_logging(cfg)
    tracing.configure("reranker")
    from dwsearch_reranker.main import run_reranker

    asyncio.run(run_reranker(cfg))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    cfg = _config(cfgmod.MigrateConfig, args)
    _setup_logging(cfg)
    from dwsearch.db.embedded import database_url
    from dwsearch.db.migrate import MigrationError, migrate

    url = database_url(cfg.database_url, cfg.data_dir)
    try:
        applied = migrate(url, dev_schema=args.dev_schema)
    except MigrationError as exc:
        raise SystemExit(f"migrate: {exc}") from None
    print(
        f"applied {len(applied)} migration(s)"
        + (": " + ", ".join(applied) if applied else "; schema is current")
    )
    if args.hnsw_index:
        model, _, dimension = args.hnsw_index.rpartition("=")
        if not model or not dimension.isdigit():
            raise SystemExit("--hnsw-index takes MODEL=DIMENSION, e.g. BAAI/bge-m3=1024")
        print(f"hnsw index {asyncio.run(_create_hnsw_index(url, model, int(dimension)))} ready")
    return 0


async def _create_hnsw_index(url: str, model: str, dimension: int) -> str:
    from psycopg import AsyncConnection

    from dwsearch.search.store.knn import create_hnsw_index

    async with await AsyncConnection.connect(url, autocommit=True) as conn:
        return await create_hnsw_index(conn, model, dimension)


def cmd_knn_indexes(args: argparse.Namespace) -> int:
    cfg = _config(cfgmod.MigrateConfig, args)
    _setup_logging(cfg)
    from dwsearch.db.embedded import database_url
    from dwsearch.search.knnindex import KNN_INDEX_MIN_WINDOWS

    min_windows = KNN_INDEX_MIN_WINDOWS if args.min_windows is None else args.min_windows
    if min_windows < 1:
        raise SystemExit("--min-windows must be at least 1")
    asyncio.run(_knn_indexes(database_url(cfg.database_url, cfg.data_dir), min_windows, args.dry_run))
    return 0


async def _knn_indexes(url: str, min_windows: int, dry_run: bool) -> None:
    from psycopg import AsyncConnection

    from dwsearch.search import knnindex

    async with await AsyncConnection.connect(url, autocommit=True) as conn:
        plan = await knnindex.plan_indexes(conn, min_windows)
        for p in plan:
            print(
                f"{p.action} org={p.org_id} model={p.model} windows={p.windows}: {p.reason} ({p.index_name})"
            )
        if not plan:
            print(f"no org has {min_windows} windows of a model, nor an index of its own")
        if not dry_run:
            await knnindex.apply_plan(conn, plan)
            print(f"done: {sum(p.action is not knnindex.Action.KEEP for p in plan)} change(s)")


def _sweep_client(runner: str) -> Callable[[argparse.Namespace], int]:
    """A command that calls SweepService through dwsearch.sweep.commands.<runner>(cfg, args)."""

    def command(args: argparse.Namespace) -> int:
        cfg = _config(cfgmod.ClientConfig, args)
        _setup_logging(cfg)
        tracing.configure(args.command)  # the run is one trace: sweep, purge, …
        from dwsearch.sweep import commands as sweep_commands

        return int(getattr(sweep_commands, runner)(cfg, args))

    return command


cmd_sweep = _sweep_client("run_sweep_command")
cmd_purge = _sweep_client("run_purge_command")
cmd_sweep_status = _sweep_client("run_status_command")
cmd_retry_poison = _sweep_client("run_retry_poison_command")
cmd_forget = _sweep_client("run_forget_command")


def cmd_gaps(args: argparse.Namespace) -> int:
    cfg = _config(cfgmod.ClientConfig, args)
    _setup_logging(cfg)
    from dwsearch.index.commands import run_gaps_command
    from dwsearch.sweep.commands import parse_cutoff

    return run_gaps_command(cfg, args, parse_time=parse_cutoff)


def cmd_model_check(args: argparse.Namespace) -> int:
    cfg = _config(cfgmod.ModelCheckConfig, args)
    _setup_logging(cfg)
    from dwsearch.modelcheck import run_command

    return run_command(cfg)


def cmd_dev(args: argparse.Namespace) -> int:
    cfg = _config(cfgmod.StackConfig, args)
    _setup_logging(cfg)
    from dwsearch.stack import run_dev

    return run_dev(cfg)


def cmd_demo(args: argparse.Namespace) -> int:
    cfg = _config(cfgmod.StackConfig, args)
    _setup_logging(cfg)
    from dwsearch.demo import run_demo

    return run_demo(cfg, keep_running=args.keep_running)


def cmd_export_onnx(args: argparse.Namespace) -> int:
    from dwsearch.common.errors import StartupError
    from dwsearch.modelserver.threads import apply_thread_env, resolve_threads

    cfg = _config(cfgmod.LoggingConfig, args)
    _setup_logging(cfg)
    # DWSEARCH_THREADS and DWSEARCH_ONNX_CACHE_DIR as the embedder reads (and checks) them.
    embedder = cfgmod.load(
        cfgmod.EmbedderConfig, {"threads": args.threads, "onnx_cache_dir": args.onnx_cache_dir}
    )
    threads = resolve_threads(embedder.threads)
    apply_thread_env(threads)  # before torch is imported
    from dwsearch.export_onnx import Request, export

    cache_dir = embedder.onnx_cache_dir
    request = Request(
        model=args.model, kind=args.kind, backend=args.backend, quantize=args.quantize, output=args.output,
        cache_dir=cache_dir, model_id=args.model_id, threads=threads,
    )  # fmt: skip
    try:
        directory, manifest, exported = export(request)
    except StartupError as exc:
        print(f"dwsearch export-onnx: error: {exc}", file=sys.stderr)
        return 2
    state = f"exported in {manifest['export_seconds']} s" if exported else "already exported, up to date"
    print(f"{directory}: {manifest['kind']} {manifest['backend']} {manifest['quantize']}, "
          f"{manifest['bytes'] / 1e6:.0f} MB, {state}")  # fmt: skip
    from dwsearch.modelserver import onnxexport
    from dwsearch.modelserver.quantcheck import QuantizationCheck

    check = QuantizationCheck.from_manifest(manifest.get("check"))
    if check is not None:
        print(f"int8 check against float32 {'passed' if check.passed else 'FAILED'}: {check.summary()}")
        if not check.passed:
            print(
                f"dwsearch export-onnx: error: {check.failure}; the services will not serve this export "
                "and run float32 instead",
                file=sys.stderr,
            )
            return onnxexport.EXIT_CHECK_FAILED
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dwsearch",
        description="Self-hosted multilingual semantic search for chat history and support knowledge.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(
        name: str, func: Callable[[argparse.Namespace], int], cls: type, helptext: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=helptext, description=helptext)
        _add_config_flags(p, cls)
        # config_class: which settings the command reads (docs/generate.py's reference).
        p.set_defaults(func=func, config_class=cls)
        return p

    add("serve", cmd_serve, cfgmod.ServerConfig, "run SearchService, SweepService and IndexService")
    add("embedder", cmd_embedder, cfgmod.EmbedderConfig, "run the EmbedderService (bge-m3 by default)")
    add(
        "reranker",
        cmd_reranker,
        cfgmod.RerankerConfig,
        "run the RerankerService (bge-reranker-v2-m3 by default)",
    )
    p = add("sweep", cmd_sweep, cfgmod.ClientConfig, "call SweepService.Sweep once (what the CronJob runs)")
    p.add_argument("--org-id", default="", help="sweep only this org")
    p.add_argument("--max-windows", type=int, default=0, help="stop after this many windows (0 = no limit)")
    p.add_argument(
        "--max-duration", type=float, default=0.0, help="stop starting windows after N seconds (0 = none)"
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: when stderr is a terminal)",
    )
    p = add(
        "purge",
        cmd_purge,
        cfgmod.ClientConfig,
        "call SweepService.Purge: delete embeddings of events before a cutoff",
    )
    p.add_argument("--org-id", required=True, help="the org whose retention is applied")
    p.add_argument(
        "--cutoff", required=True, help="ISO 8601 time, e.g. 2026-10-30T00:00:00Z, or a duration like 30d"
    )
    p = add(
        "sweep-status",
        cmd_sweep_status,
        cfgmod.ClientConfig,
        "call SweepService.Status: backlog, keys behind or failing, poison windows",
    )
    p.add_argument("--org-id", default="", help="only this org")
    p.add_argument("--model", default="", help="only this model (default: the server's)")
    p.add_argument("--all", action="store_true", help="list every key, caught up or not")
    p.add_argument("--json", action="store_true", help="print the whole StatusResponse as JSON")
    p.add_argument(
        "--max-lag",
        default="",
        help="exit 3 when a key, or an event no sweep has reached yet, lags more than this age (e.g. 1h)",
    )
    p.add_argument("--fail-on-poison", action="store_true", help="exit 3 when poison windows exist")
    p = add(
        "retry-poison",
        cmd_retry_poison,
        cfgmod.ClientConfig,
        "call SweepService.RetryPoison: release poison windows for the next sweep",
    )
    p.add_argument("--org-id", default="", help="only this org's poison windows")
    p.add_argument("--id", action="append", help="only this poison window (repeatable); default: all")
    p = add(
        "forget",
        cmd_forget,
        cfgmod.ClientConfig,
        "call SweepService.Forget: take deleted or edited messages' old text out of search now",
    )
    p.add_argument("--org-id", required=True, help="the messages' org")
    p.add_argument("message_ids", nargs="+", metavar="MESSAGE_ID", help="dw_chat_events ids")
    p = add(
        "gaps",
        cmd_gaps,
        cfgmod.ClientConfig,
        "call IndexService.ListKnowledgeGaps: an org's knowledge gaps (agent-context questions its knowledge "
        "articles do not answer), near duplicates grouped, most frequent first; or delete them",
    )
    p.add_argument("--org-id", required=True, help="the org (the app id the gaps were recorded for)")
    p.add_argument("--since", default="", help="only gaps since: an ISO 8601 time or an age like 7d")
    p.add_argument("--limit", type=int, default=0, help="groups to list, 1..100 (default: 20)")
    p.add_argument("--json", action="store_true", help="print the whole ListKnowledgeGapsResponse as JSON")
    p.add_argument(
        "--forget",
        action="append",
        metavar="GAP_ID",
        help="delete this gap instead (repeatable; ids from --json)",
    )
    p.add_argument("--forget-all", action="store_true", help="delete every gap of the org instead")
    p = add(
        "model-check",
        cmd_model_check,
        cfgmod.ModelCheckConfig,
        "check the deployed embedder (and reranker) on the shipped probe set: model, int8 check, "
        "cross-lingual recall, reranking; exit 1 below a threshold, 2 when a service cannot be reached "
        "(run it before an environment's semantic-search flag goes on)",
    )
    p.add_argument("--model", dest="embed_model", default=None, help="the same as --embed-model")
    p = add("migrate", cmd_migrate, cfgmod.MigrateConfig, "apply dwsearch's database migrations (idempotent)")
    p.add_argument(
        "--dev-schema", action="store_true", help="also create the Go-owned tables (development and tests)"
    )
    p.add_argument(
        "--hnsw-index",
        metavar="MODEL=DIMENSION",
        default="",
        help="also build the opt-in HNSW index over one model's vectors (serve with --knn-index hnsw)",
    )
    p = add(
        "knn-indexes",
        cmd_knn_indexes,
        cfgmod.MigrateConfig,
        "give each org with many windows of a model an HNSW index of its own, and drop those of orgs under half "
        "the threshold (idempotent; search uses them with --knn-index auto)",
    )
    p.add_argument(
        "--min-windows",
        type=int,
        default=None,
        help="live windows of a model from which an org gets its own index (default: 10000)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan (build, drop, keep) and change nothing"
    )
    p = add(
        "export-onnx",
        cmd_export_onnx,
        cfgmod.LoggingConfig,
        "export a model directory to ONNX (what the embedder / reranker run with --embed-runtime onnx)",
    )
    p.add_argument(
        "--model", required=True, help="the model directory (as DWSEARCH_EMBED_MODEL / DWSEARCH_RERANK_MODEL)"
    )
    p.add_argument(
        "--kind", choices=["embedder", "reranker"], default="embedder", help="which service runs it"
    )
    p.add_argument(
        "--backend",
        default="auto",
        help="the embedder backend, as DWSEARCH_EMBED_BACKEND: auto | bge-m3 | sentence-transformers",
    )
    p.add_argument(
        "--quantize",
        choices=["none", "int8", "int8-7bit"],
        default="int8",
        help="int8 (the variant this CPU class runs exactly: 8-bit weights with VNNI or on ARM64, "
        "7-bit elsewhere; checked against float32), int8-7bit (7-bit weights on any CPU) or none "
        "(float32) (default: int8). Export on a node of the CPU class that will serve it",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help="directory to write; default: the cache entry the services look up under --onnx-cache-dir. "
        "MODEL/onnx/int8 (or fp32) is found beside the weights",
    )
    p.add_argument(
        "--onnx-cache-dir",
        type=Path,
        default=None,
        help="the services' ONNX cache [env DWSEARCH_ONNX_CACHE_DIR] (default: user cache dir/dwsearch/onnx)",
    )
    p.add_argument("--model-id", default="", help="model id to record (as DWSEARCH_EMBED_MODEL_ID)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads [env DWSEARCH_THREADS]; 0 = the container's CPU quota",
    )
    add("dev", cmd_dev, cfgmod.StackConfig, "run the whole stack locally on the embedded defaults")
    p = add(
        "demo",
        cmd_demo,
        cfgmod.StackConfig,
        "run the stack with sample multilingual chat and example queries",
    )
    p.add_argument(
        "--keep-running", action="store_true", help="leave the stack running and print its addresses"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    from dwsearch.common.errors import StartupError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except StartupError as exc:  # a setting or a prerequisite is wrong: say which, no traceback
        raise SystemExit(f"dwsearch {args.command}: {exc}") from None
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
