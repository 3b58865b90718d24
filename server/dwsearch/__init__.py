"""dwsearch: self-hosted multilingual semantic search for chat history and support knowledge.

Package map (every package is the folder its import path names: dwsearch.search is
server/dwsearch/search/; docs/architecture.md has the modules and the import rule):
- dwsearch.v1           generated protobuf / gRPC code; never edited by hand
- dwsearch.modelserver  the runtime both model services share (batching, admission, model files,
                        threads, ONNX Runtime, the int8 guard), beside dwsearch.common
- dwsearch.common       what every process shares: config, errors, logging, the gRPC server
                        (health, reflection, interceptor, SIGTERM), TLS, metrics, the CPU
                        offloader
- dwsearch.db           Postgres: the embedded server, the pool, migrations, the schema check
- dwsearch.clients      gRPC clients of the model services (embedder, reranker, circuit breaker)
- dwsearch.retrieval    the retrieval core search and the index share: fusion, stage times,
                        degradation reasons
- dwsearch.search       SearchService: full text + dense + sparse legs, fusion, rerank
- dwsearch.sweep        SweepService: the watermark sweep that embeds closed conversation windows
- dwsearch.index        IndexService: the support app's typed documents, filters, agent context
- dwsearch.rest         the Upstash-Vector-compatible REST API over the index
- dwsearch.console      the operators' web console (`serve --console-port`): search, index, sweep
- dwsearch.serve        `dwsearch serve`: Search, Sweep and Index services in one process
- dwsearch.cli          the `dwsearch` command
- dwsearch.stack        `dwsearch dev`: the whole stack as local processes
- dwsearch.demo         `dwsearch demo`
- dwsearch.demo_data    the demo's sample multilingual chat
- dwsearch.export_onnx  `dwsearch export-onnx`
- dwsearch.modelcheck   `dwsearch model-check`: the rollout check of the deployed model services
- dwsearch.redaction    PII redaction before any text is embedded
- dwsearch.flags        the org and admin switches of semantic search
- dwsearch_embedder     EmbedderService: its own package, embedder/dwsearch_embedder/
- dwsearch_reranker     RerankerService: its own package, reranker/dwsearch_reranker/
"""

__version__ = "0.1.0"
