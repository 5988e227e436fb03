"""The project's named failure for a stage that could not finish (light module: the CLI imports it)."""


class PipelineError(RuntimeError):
    """A stage stopped short; the message says what finished, what did not, and what to do."""
