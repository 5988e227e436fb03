"""Toy targets: small Qwen3 models with their own tokenizer, built on the spot and cached.

Production paths never import this package: its `toy:NAME` scheme plugs into
targets/schemes.py through an entry point (scheme.py). What runs *on* the toys (the demo,
reference shards, quality figures) lives in `pipeline/demo/`.
"""
