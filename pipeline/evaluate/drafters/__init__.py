"""Drafters: a trained draft as the evaluator drafts with it, exactly as a serving engine would.

`base` (the `Drafter` protocol, `DraftBlocks`, the shared live proposal),
`dspark` (DSpark and DFlash blocks, left-to-right Markov drafting),
`eagle3` (EAGLE-3's step loop), `registry` (which drafter drafts each kind),
`load` (a draft from a run directory, a checkpoint or a speculators export).
"""
