"""What the replica and its write-back process say to each other: one frozen dataclass per message.

To the child (`ToChild`), through a `multiprocessing.Queue`, in this order
for a unit: `Open` (its provenance, once), `Add` per sample, `Finish`; any
time after `Bind`: `Discard`. The engine thread queues them and sends each
engine step's as one `Batch` (one pickle and one pipe write per step);
`Bind` and `Close` go alone. Back (`FromChild`), through a one-way pipe:
`Written` or `Failed` per finished unit, and `Stopped` last.

Both sides dispatch on the type (`match`), and an unknown message is a
`TypeError`, so a message added here without a handler fails the first test
that sends it rather than being dropped. Every field pickles: errors cross as
(transient, text), not as exception objects whose classes the other side may
not import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.corpus.records import RowError
    from pipeline.regenerate.replica.pending import PendingSample
    from pipeline.regenerate.replica.writeback import ShardTarget, UnitWritten
    from pipeline.shards.schema import Provenance
    from pipeline.targets.base import CapturedRows


class WritebackFailed(RuntimeError):
    """The write-back process died or broke: no unit in it can finish."""


# --------------------------------------------------------------------------- to the child


@dataclass(frozen=True)
class Bind:
    """Start serving the engine: `contract` names its capture spool (None: rows come in
    memory). The child builds its `ShardWriteback` on this, once it has been placed."""

    contract: Any


@dataclass(frozen=True)
class Open:
    """The provenance of `unit_id`'s samples, sent before its first `Add`."""

    unit_id: str
    provenance: Provenance


@dataclass(frozen=True)
class Add:
    """One sample of an opened unit; `where` names it in its error record."""

    unit_id: str
    sample: PendingSample
    where: str


@dataclass(frozen=True)
class Discard:
    """Rows of a finished request that becomes no sample: release them."""

    rows: CapturedRows


@dataclass(frozen=True)
class Finish:
    """Write `unit_id`'s shard once its samples are encoded, with `errors` as its error
    records; the child answers `Written` or `Failed`."""

    unit_id: str
    target: ShardTarget
    errors: tuple[RowError, ...]


@dataclass(frozen=True)
class Batch:
    """One engine step's messages, in order."""

    messages: tuple[Open | Add | Discard | Finish, ...]


@dataclass(frozen=True)
class Close:
    """Stop: close the write-back (units not finished fail) and answer `Stopped`."""


ToChild = Bind | Open | Add | Discard | Finish | Batch | Close


# --------------------------------------------------------------------------- back


@dataclass(frozen=True)
class Written:
    """`unit_id`'s shard is written."""

    unit_id: str
    written: UnitWritten


@dataclass(frozen=True)
class Failed:
    """`unit_id`'s shard could not be written. `transient`: worth retrying (the scheduler
    retries transient errors; storage.is_transient decided it in the child)."""

    unit_id: str
    transient: bool
    text: str

    @classmethod
    def of(cls, unit_id: str, err: BaseException) -> Failed:
        from pipeline.storage import is_transient

        transient = is_transient(err) or isinstance(err, TimeoutError)
        return cls(unit_id, transient, f"{type(err).__name__}: {err}")

    def error(self) -> BaseException:
        """The error the unit's callback gets: a `ConnectionError` (transient, retried) or
        `WritebackFailed`."""
        return ConnectionError(self.text) if self.transient else WritebackFailed(self.text)


@dataclass(frozen=True)
class Stopped:
    """The child closed its write-back; nothing follows."""


FromChild = Written | Failed | Stopped
