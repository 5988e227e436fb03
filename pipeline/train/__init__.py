"""The training stage: DSpark / DFlash / EAGLE-3 drafts from committed shards (docs/train.md).

`trainer.train(config)` is the entry point; `drafts/registry.py` is the one
table of draft kinds; `checkpoint.py` the checkpoint layout; `export.py` the
speculators format vLLM serves.
"""
