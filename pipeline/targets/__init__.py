"""Target backends behind one interface (`base.TargetBackend`): vLLM (production) and
transformers (reference). `resolve` turns a model reference into a model and a backend."""
