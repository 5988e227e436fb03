"""The shard file format: the Arrow schema, codecs, the writer and the sample-index sidecar.

One Parquet file per unit attempt, written create-only, with its provenance and
schema version in the file's metadata. This package knows nothing of versions
or manifests: those are the versioned table's (`pipeline.table`).
"""
