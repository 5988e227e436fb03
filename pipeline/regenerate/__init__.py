"""The regeneration stage (DESIGN.md §1.1): units -> replicas -> shards -> committed versions.

`config` (the job's YAML), `units` (deterministic work units), `provenance`
(what produced the data), `unit` (one unit's job on a backend, without Ray),
`replica` (the Ray actor around it, placement), `run` (the driver and the
in-process runner), `summary` (the report and progress bar).
"""
