"""The draft vocabulary of a training run: counted once from the training split, then recorded.

`draft.draft_vocab_size: N` gives the draft a head of N rows
(pipeline/drafts/vocab.py): the N tokens most frequent among the loss-masked
tokens (the regenerated answers) of the training split's samples, as
speculators counts them, plus the target's EOS tokens (an answer must be able
to end). `run_draft_vocab` counts them at the start of a fresh run; a resumed
run takes the vocabulary its checkpoint's DraftSpec records, so resume,
export and evaluation all use the maps the draft was trained with. What the
run chose is written to `<out_dir>/draft_vocab.json` (size, the share of
answer tokens it covers, the tokens counted).

Counting reads only the `input_ids` and `loss_mask` columns (no hidden
states): seconds for a dataset that takes hours to train on.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.drafts.checkpoint import latest_checkpoint, load_checkpoint
from pipeline.drafts.vocab import coverage, select_draft_vocab
from pipeline.logs import kv
from pipeline.storage import write_text_atomic
from pipeline.targets.resolve import eos_token_ids

if TYPE_CHECKING:
    import numpy as np

    from pipeline.table.split import DatasetSplit, RowRef

log = logging.getLogger(__name__)

VOCAB_FILE = "draft_vocab.json"


def answer_token_counts(
    split: DatasetSplit, vocab_size: int, rows: list[RowRef] | None = None
) -> np.ndarray:
    """(V,) int64: occurrences of each token among the loss-masked tokens of the
    split's training rows (or `rows`), each truncated to the split's max_seq_len as
    training reads it."""
    import numpy as np

    from pipeline.shards.reader import read_row_group
    from pipeline.table.reader import open_shard

    counts = np.zeros(vocab_size, dtype=np.int64)
    groups: dict[tuple[int, int], list[int]] = {}
    for ref in split.train_rows if rows is None else rows:
        groups.setdefault((ref.shard, ref.row_group), []).append(ref.row)
    limit = split.max_seq_len
    for (shard, group), rows in sorted(groups.items()):
        entry = split.entries[shard]
        pf, _ = open_shard(split.dataset, entry)
        with pf:
            table = read_row_group(
                pf, group, split.dataset.shard_url(entry), ["input_ids", "loss_mask"]
            ).take(rows)
        for ids, mask in zip(
            table.column("input_ids").to_pylist(),
            table.column("loss_mask").to_pylist(),
            strict=True,
        ):
            ids, mask = np.asarray(ids[:limit]), np.asarray(mask[:limit], dtype=bool)
            counts += np.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def run_draft_vocab(
    *,
    size: int,
    split: DatasetSplit,
    vocab_size: int,
    target_dir: str | Path,
    out_dir: str | Path,
    write: bool = True,
) -> tuple[int, ...]:
    """The run's draft vocabulary: the one its latest checkpoint records (a resume),
    else counted from `split` now (module docstring); `write`: record the choice in
    <out_dir>/draft_vocab.json (rank 0)."""
    path = latest_checkpoint(out_dir)
    if path is not None:
        recorded = load_checkpoint(path).spec.draft_vocab
        if recorded is not None and len(recorded) == size:
            return recorded
    counts = answer_token_counts(split, vocab_size)
    eos = tuple(t for t in eos_token_ids(target_dir) if t < vocab_size)
    vocab = select_draft_vocab(counts, size, always=eos)
    share = coverage(counts, vocab)
    total = int(counts.sum())
    log.info(
        "draft vocabulary %s",
        kv(size=size, of=vocab_size, answer_tokens=total, coverage=f"{share:.4f}"),
    )
    if write:
        record = {
            "draft_vocab_size": size,
            "target_vocab_size": vocab_size,
            "answer_tokens": total,
            "answer_tokens_outside": total - int(counts[list(vocab)].sum()),
            "coverage": share,
            "distinct_answer_tokens": int((counts > 0).sum()),
            "always_kept": list(eos),
            "data_version": split.manifest.version,
        }
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(out_dir) / VOCAB_FILE, json.dumps(record, indent=2) + "\n")
    return vocab
