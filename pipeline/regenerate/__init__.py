"""The regeneration stage (docs/design.md#how-they-fit): units -> replicas -> shards -> committed versions.

Two processes do the work, and the folders follow them:

* `driver/`: the run's own process. It plans the units against the
  dataset's latest version (`partition`, `worklist`, `provenance`), samples
  self-prompts first where the corpus asks for them (`self_prompts`), starts
  and places the replica actors on Ray (`pool`), hands them units and
  retries what fails (`scheduler`), and reports (`summary`).
* `replica/`: one replica actor's process tree. The actor (`actor`) holds
  one capturing engine, keeps it full with many units (`feeder`), turns each
  unit's conversations into requests and samples (`unit_job`, `pending`),
  and writes their shards off the engine's path (`writeback`, in a child
  process: `writeback_process`, `spill`); `cpu_host` places its processes on
  a CPU host.

Shared by both sides, here: `config` (the job's YAML; its replica sections
sit beside their owners in `replica/`) and `units` (what crosses between
them: `WorkUnit` and `UnitSpec` out, `UnitResult` back). Entry points, above
both: `run` (`run_regenerate` on Ray; `run_local`, the same in one process
without Ray, which drives a feeder itself), `refresh` (a run that also
applies changed and removed samples) and `target_check` (`verify
--against-target`, a check of the stage's output).

The rule (tests/test_layers.py): `replica/` imports nothing of `driver/` or
of the entry points, only `config` and `units`, so a replica's process
never loads planning or scheduling code; `driver/` imports nothing of
`replica/` but the actor class the pool starts (`replica.actor`), so it
never depends on how a replica works inside; `config` and `units` import
nothing of `driver/`.
"""
