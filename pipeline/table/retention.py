"""The time bounds that keep gc and commits apart, all judged on the object store's clock.

gc deletes an unreferenced file only once it is `min_age_s` old by the store's
own timestamps (S3 `LastModified` against the `Date` the store answers with;
local mtimes against this host's clock), never by a writer's clock. A commit
names a new file only if its commit point lands within `MAX_COMMIT_AGE_S` of
that file's write, again on the store's clock: it checks before its root put
(and publishes nothing if a file is older), and again on its root's own
timestamp after it (commit.py).

With `min_age_s > MAX_COMMIT_AGE_S` the two cannot meet: a file gc may delete
was already older than `min_age_s` when gc listed it, so a root that lands
after gc read the versions would be more than `MAX_COMMIT_AGE_S` younger than
the file, and no commit publishes such a root. The defaults follow the
trusted table formats (Delta's VACUUM keeps 7 days, Iceberg's orphan removal
3): a commit may take up to a day from a shard's write to its commit point
(a regeneration commits every few minutes), gc keeps unreferenced files 3
days. A shorter minimum age needs `unsafe=True` (`gc --unsafe-min-age`);
then only live write sessions protect commits in flight.
"""

from __future__ import annotations

import math

HOUR_S = 3600.0
MAX_COMMIT_AGE_S = 24 * HOUR_S  # a shard's write to the commit point that names it
DEFAULT_MIN_AGE_S = 72 * HOUR_S  # gc's minimum age of an unreferenced file
# gc reads the published versions again when this long has passed since its last
# read, before each delete; a commit that landed late waits twice this before it
# checks its files, so any gc that could still delete them has seen its root.
GC_REREAD_S = 30.0


class UnsafeMinAge(ValueError):
    """A gc minimum age below the longest commit, without the explicit override."""


def check_min_age(min_age_s: float, *, unsafe: bool = False, what: str = "min_age_s") -> float:
    """`min_age_s` if it is a usable gc minimum age, else ValueError naming `what`."""
    if not isinstance(min_age_s, (int, float)) or isinstance(min_age_s, bool):
        raise ValueError(f"{what} must be a number, got {min_age_s!r}")
    if not math.isfinite(min_age_s) or min_age_s < 0:
        raise ValueError(f"{what} must be a finite age >= 0, got {min_age_s / HOUR_S:g} h")
    if min_age_s <= MAX_COMMIT_AGE_S and not unsafe:
        raise UnsafeMinAge(
            f"{what} of {min_age_s / HOUR_S:g} h is not above the longest commit a writer may "
            f"take ({MAX_COMMIT_AGE_S / HOUR_S:g} h): gc could delete the files of a commit in "
            "flight; pass --unsafe-min-age (unsafe=True) to run it anyway"
        )
    return float(min_age_s)
