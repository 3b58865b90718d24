"""Helpers both the benchmarks and the tests import: the deterministic fake model services
(fakes), the Go-owned rows a test or a benchmark seeds (seed) and small real models built
on the fly (tiny_models). A package of bench/, so `python -m bench.<name>` imports it from
the repository root and pytest through pyproject's `pythonpath` ("."); the tests' own
helpers stay in tests/support."""
