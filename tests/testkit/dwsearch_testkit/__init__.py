"""Test helpers the benchmarks also use: the deterministic fake model services (fakes),
the Go-owned rows a test or a benchmark seeds (seed), small real models built on the
fly (tiny_models) and a free port for a server one starts (net). They live with the
tests; the editable install lists tests/testkit, so `python -m bench.<name>` imports them
as pytest does (pyproject's `pythonpath`). The tests' own helpers are in tests/support."""
