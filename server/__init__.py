"""dwsearch: self-hosted multilingual semantic search for chat history and support knowledge.

Package map (top level of the repository in brackets):
- dwsearch.v1           generated protobuf / gRPC code [server/v1] — never edited by hand
- dwsearch.common       one bootstrap for all three processes: config, errors, logging,
                        gRPC server (health, reflection, interceptor, SIGTERM), metrics
- dwsearch.db           Postgres: embedded server, pool, migrations, schema check
- dwsearch.cli          the `dwsearch` command
- dwsearch.embedder     EmbedderService [embedder/]
- dwsearch.reranker     RerankerService [reranker/]
"""

__version__ = "0.1.0"
