"""Typed config of the corpus: the input sources and the optional synthetic corpus."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config import ConfigModel
from pipeline.corpus.synthetic import SyntheticCorpusConfig


class CorpusSourceConfig(ConfigModel):
    """One input corpus: a file, a directory or a hub dataset."""

    # Local path, s3:// URI, or Hugging Face dataset name.
    path: str
    name: str | None = None
    format: Literal["auto", "jsonl", "parquet", "hf"] = "auto"
    split: str = "train"
    # Column holding a domain tag; else `domain` below applies to every row.
    domain_column: str | None = None
    domain: str | None = None
    # S3-compatible endpoint for s3:// paths (else AWS_ENDPOINT_URL, else AWS).
    endpoint_url: str | None = None
    # Stop after this many rows (for smoke runs); None reads everything.
    max_rows: int | None = Field(None, gt=0)


class CorpusConfig(ConfigModel):
    synthetic: SyntheticCorpusConfig | None = None
    sources: list[CorpusSourceConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _some_input(self) -> CorpusConfig:
        if self.synthetic is None and not self.sources:
            raise ValueError("give `synthetic` or at least one entry in `sources`")
        return self
