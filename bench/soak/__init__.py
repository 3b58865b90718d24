"""The soak (python -m bench.soak): dwsearch run as a service under a production-like
workload and a schedule of faults, with a checker of what must hold. See __main__.py."""
