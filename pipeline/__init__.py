"""dspark-targets: training targets for speculative-decoding drafts at cluster scale.

The library is split by stage (see docs/design.md#the-parts); heavy imports (torch, vLLM,
Ray) live inside the modules that need them so the CLI starts fast.
"""

__version__ = "0.1.0"
