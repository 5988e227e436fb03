"""Draft models, their speculators export formats and their evaluation-side drafters.

One folder per draft kind, each with the same three modules: `model` (the
nn.Module the trainer trains), `export` (its speculators format: config.json
written and read) and `drafter` (how the evaluator drafts with it):
`dspark/` (DSpark, and DFlash: the same backbone without the heads) and
`eagle3/` (the EAGLE-3 baseline). `registry` is the one table of kinds that
training, export and evaluation read. Shared: `spec` (DraftSpec, what a
checkpoint records), `family` (what a draft copies from its target's
config), `common` (inputs, outputs, Qwen3 layers, block attention, the
frozen target head), `drafter` (the Drafter protocol), `speculators` (the
fields every format shares), `export` (writing and reading an export
directory), `checkpoint` (a training run's checkpoint layout), `load` (a
draft from a run, a checkpoint or an export) and `vllm_check` (serving an
export with vLLM). Below train/ and evaluate/, above shards/ and targets/:
nothing here imports either stage.
"""
