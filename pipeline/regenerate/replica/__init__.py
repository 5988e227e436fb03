"""One replica's side of regeneration: an engine fed with units, its shards written beside it.

`actor` (the Ray actor, a thin wrapper), `feeder` (keeps one engine full with
many units), `unit_job` (one unit's conversations as a state machine),
`pending` (the one sample type a unit emits), `writeback` (the `Writeback`
protocol and its in-process implementation), `writeback_process` (the same
in a child process: the parent's side; `writeback_child`, the child's;
`writeback_messages`, the typed messages between them),
`spill` (encoded rows of unfinished units on local disk), `cpu_host` (the
replica's processes placed on a CPU host). Of the rest of the stage it
imports only `regenerate.config` and `regenerate.units` (the package
docstring has the rule).
"""
