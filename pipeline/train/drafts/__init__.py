"""The draft models and the one table of draft kinds.

`spec` (DraftSpec: the resolved architecture, what a checkpoint records),
`registry` (every kind: model, config rules, loss, export format, vLLM method),
`common` (inputs, outputs and Qwen3 building blocks the kinds share, the
frozen target head), `dspark` (the DSpark draft; DFlash is its backbone
without the heads), `eagle3` (the EAGLE-3 baseline).
"""
