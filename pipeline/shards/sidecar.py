"""Per-shard sample index (the sidecar): which sample ids a shard holds, with their input hashes.

A commit must know the sample ids of the shards it publishes (a version never
holds a sample twice), and a refresh must know every committed id with the
input it was made from. Reading them from the Parquet files would open every
shard; instead each committed shard has a small JSON sidecar,
`index/<shard name>.json`, written create-only by the commit from what the
writer reported (`ShardInfo.samples`) and bound to the shard by its sha256:

    {"format": "dspark-targets.sidecar", "sidecar_version": 1,
     "shard": "shards/<name>.parquet", "sha256": "<of the shard file>",
     "rows": [[sample_id, input_hash, domain, source, tokens], ...],   # file order
     "attempted": [[sample_id, input_hash], ...]}                       # planned, no row

`attempted` lists the samples a unit was asked for that produced no row
(a prompt too long for the context, an empty answer): they count as done for
planning (a rerun does not retry a deterministic failure) and as members for
the exactly-once check, like rows.

A shard's file is never opened for its members: a commit of a shard whose
writer reported none (a file with rows but no `ShardInfo.samples`) is refused.

The partition key of a sample (`corpus.identity.partition_key`) is a 64-bit hash of its
conversation part (the sample id without its `-<turn>` suffix), so every turn
of a conversation has the same key and a conversation's bucket never depends
on the corpus size. `SampleIndex.key_range` is the range of a shard's members;
the versioned table records it per shard and compares only shards whose
ranges overlap (`pipeline/table/ranges.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from pipeline.corpus.identity import KEY_BITS, input_hash, partition_key
from pipeline.shards.errors import DatasetError

SIDECAR_FORMAT = "dspark-targets.sidecar"
SIDECAR_VERSION = 1
SIDECAR_PREFIX = "index/"


def bucket_of(key: int, num_buckets: int) -> int:
    """Bucket of a partition key when the key space is cut into `num_buckets` equal ranges."""
    return (key * num_buckets) >> KEY_BITS


def sidecar_key(shard_path: str) -> str:
    name = shard_path.rsplit("/", 1)[-1].removesuffix(".parquet")
    return f"{SIDECAR_PREFIX}{name}.json"


@dataclass(frozen=True)
class SampleRow:
    sample_id: str
    input_hash: str
    domain: str
    source: str
    tokens: int


@dataclass(frozen=True)
class SampleIndex:
    """The members of one shard: its rows and the samples attempted without a row."""

    shard: str
    sha256: str
    rows: tuple[SampleRow, ...]
    attempted: tuple[tuple[str, str], ...] = ()  # (sample_id, input_hash)

    def members(self) -> Iterator[tuple[str, str]]:
        """(sample_id, input_hash) of every row and every attempted sample."""
        for row in self.rows:
            yield row.sample_id, row.input_hash
        yield from self.attempted

    def member_ids(self) -> set[str]:
        return {sid for sid, _ in self.members()}

    def key_range(self) -> tuple[int, int] | None:
        keys = [partition_key(sid) for sid, _ in self.members()]
        return (min(keys), max(keys)) if keys else None

    def to_json(self) -> str:
        body = {
            "format": SIDECAR_FORMAT,
            "sidecar_version": SIDECAR_VERSION,
            "shard": self.shard,
            "sha256": self.sha256,
            "rows": [[r.sample_id, r.input_hash, r.domain, r.source, r.tokens] for r in self.rows],
            "attempted": [list(a) for a in self.attempted],
        }
        return json.dumps(body, separators=(",", ":")) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> SampleIndex:
        try:
            body = json.loads(text)
            if body.get("format") != SIDECAR_FORMAT or body.get("sidecar_version") != 1:
                raise ValueError(f"not a {SIDECAR_FORMAT} v1 file")
            rows = tuple(
                SampleRow(str(a), str(b), str(c), str(d), int(e)) for a, b, c, d, e in body["rows"]
            )
            attempted = tuple((str(a), str(b)) for a, b in body["attempted"])
            return cls(str(body["shard"]), str(body["sha256"]), rows, attempted)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise DatasetError(f"{where}: unreadable sample index ({err})") from None


def build_index(
    shard: str,
    sha256: str,
    samples: Sequence[tuple[str, str, str, int]],
    attempted: Iterable[tuple[str, str]] = (),
) -> SampleIndex:
    """The index of a shard from the writer's report: (sample_id, domain, source, tokens) rows."""
    rows = tuple(
        SampleRow(sid, input_hash(sid, domain, source), domain, source, int(tokens))
        for sid, domain, source, tokens in samples
    )
    return SampleIndex(shard, sha256, rows, tuple(sorted(set(attempted))))
