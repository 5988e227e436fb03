"""Typed config of the corpus: the input sources and the optional synthetic corpus."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config import ConfigModel
from pipeline.corpus.near_dup import NearDuplicateConfig
from pipeline.corpus.self_prompts import SelfPromptsConfig
from pipeline.corpus.synthetic import SyntheticCorpusConfig


class CorpusSourceConfig(ConfigModel):
    """One input corpus: a file, a directory or a hub dataset."""

    # Local path, s3:// URI, or Hugging Face dataset name.
    path: str
    name: str | None = None
    # json_object: one JSON object whose values are the rows, keyed by id.
    format: Literal["auto", "jsonl", "json_object", "parquet", "hf"] = "auto"
    split: str = "train"
    # Column holding a domain tag. A row without one (or with a blank or non-string
    # one) takes `domain`, else "unknown": a missing domain is never an error.
    domain_column: str | None = None
    # Without `domain_column`: the domain of every row of this source (else a row's own
    # `domain` field, else "unknown"). With it: the default for rows that lack one.
    domain: str | None = None
    # S3-compatible endpoint for s3:// paths (else AWS_ENDPOINT_URL, else AWS).
    endpoint_url: str | None = None
    # Stop after this many rows (for smoke runs); None reads everything.
    max_rows: int | None = Field(None, gt=0)
    # A column holding a bare prompt (a user turn awaiting its answer), for row shapes
    # the readers do not know (e.g. `task_description`); other columns are ignored.
    prompt_column: str | None = None
    # The data's licence (SPDX id or the owner's words), recorded in the dataset's provenance.
    licence: str | None = None
    # Share of `corpus.size` this source contributes, relative to the other weights.
    weight: float = Field(1.0, gt=0.0)
    # Cut long conversations into consecutive windows of at most this many exchanges,
    # each its own conversation (None: whole): shorter prompts, more of them.
    max_exchanges: int | None = Field(None, gt=0)


class CorpusConfig(ConfigModel):
    synthetic: SyntheticCorpusConfig | None = None
    sources: list[CorpusSourceConfig] = Field(default_factory=list)
    # A row larger than this is the error `row_too_large`: for JSONL the line's bytes
    # (read in bounded memory, never whole), for Parquet/HF rows the UTF-8 size of
    # their strings. 16 MiB holds a ~4M-token conversation.
    max_row_bytes: int = Field(16 << 20, gt=0)
    # Content parts that are not text (images, audio, files): `error` makes the row the
    # error `non_text_part`; `skip` drops the part, counted in `IngestStats.skipped_parts`.
    non_text_parts: Literal["error", "skip"] = "error"
    # The mixture (corpus/mixture.py): conversations drawn from all sources together,
    # each source's share by its `weight`; None keeps every conversation.
    size: int | None = Field(None, gt=0)
    # Seeds the order in which each source's conversations are picked.
    mixture_seed: int = 0
    # Drop near-duplicate conversations across (and within) sources; None: exact only.
    near_duplicates: NearDuplicateConfig | None = None
    # Prompts the target writes itself (corpus/self_prompts.py), read as one more source;
    # `regenerate` samples the file first when it is missing.
    self_prompts: SelfPromptsConfig | None = None

    @model_validator(mode="after")
    def _some_input(self) -> CorpusConfig:
        if self.synthetic is None and not self.sources and self.self_prompts is None:
            raise ValueError("give `synthetic`, `self_prompts` or at least one entry in `sources`")
        return self
