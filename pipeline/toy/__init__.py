"""Toy targets: small Qwen3 models with their own tokenizer, built on the spot and cached.

Production paths never import this package; `targets/resolve.py` reaches it
(lazily) for `toy:NAME` model references. What runs *on* the toys (the demo,
reference shards, quality figures) lives in `pipeline/demo/`.
"""
