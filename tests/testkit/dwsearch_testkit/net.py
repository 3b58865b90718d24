"""Ports for the processes and servers a test or a benchmark starts: the product's own
picker (dwsearch.common.ports, which `dwsearch dev --citus-workers` uses too)."""

from dwsearch.common.ports import free_port

__all__ = ["free_port"]
