"""The regeneration run's own process: plan the units, start the replicas, hand out units, report.

`partition` (deterministic units over buckets, the corpus diff), `worklist`
(what a run still has to do against the latest version), `provenance`
(what produced the data), `self_prompts` (prompts sampled from the target
before the run), `pool` (Ray, placement, start and stop of replica actors),
`scheduler` (units to replicas, retries, hung engines), `summary` (the
report and progress bar). It imports nothing of `replica/` but the actor
class `pool` starts (the package docstring has the rule).
"""
