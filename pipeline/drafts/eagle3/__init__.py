"""EAGLE-3: the one-layer baseline trained with the training-time test (`model`), the
`eagle3` speculators format (`export`), and its step loop for evaluation (`drafter`)."""
