"""The versioned table of shard files: versions, commits, leases, pins, gc, repair, readers.

A dataset is a directory (or S3 prefix) of immutable shard files (the format:
`pipeline.shards`) that become visible only through a version's manifest,
published with a create-only put; `_latest` points at the newest. `Dataset`
(dataset.py) is the handle; docs/shards.md maps the modules.
"""
