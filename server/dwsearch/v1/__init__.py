"""Generated from protos/dwsearch/v1 by protos/generate.py. Do not edit."""
