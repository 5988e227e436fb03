"""The regeneration stage (docs/design.md#how-they-fit): units -> replicas -> shards -> committed versions.

`config` (the job's YAML), `units` (deterministic work units), `provenance`
(what produced the data), `unit` (one unit's conversations as a state
machine), `feeder` (keeps one engine full with many units), `writeback`
(encodes and writes shards off the engine's path), `replica` (the Ray actor
around them), `pool` (Ray, placement, start and stop), `run` (the driver and
the in-process runner), `summary` (the report and progress bar).
"""
