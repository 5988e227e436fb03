"""The regeneration stage (docs/design.md#how-they-fit): units -> replicas -> shards -> committed versions.

`config` (the job's YAML), `partition` (deterministic work units over
buckets, the corpus diff), `worklist` (what a run still has to do against a
dataset's latest version), `provenance` (what produced the data),
`unit_job` (one unit's conversations as a state machine), `pending` (the one
sample type a unit emits), `feeder` (keeps one engine full with many units),
`writeback` (the `Writeback` protocol and its in-process implementation),
`writeback_process` (the same in a child process), `replica` (the Ray actor
around them), `cpu_host` (tuning for a CPU engine), `pool` (Ray, placement,
start and stop), `run` (the driver and the in-process runner), `summary`
(the report and progress bar).
"""
