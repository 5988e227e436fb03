"""Subprocess side of the crash and race tests (run as a script, not collected by pytest).

python child.py write-forever  ROOT UNIT    write rows slowly until killed
python child.py write-then-die ROOT UNIT N  finish a shard, then SIGKILL itself before committing
python child.py race ROOT UNIT GO_FILE      write a shard, wait for GO_FILE, commit on version 1
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for shards.helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository

import json  # noqa: E402

from pipeline.shards.schema import Provenance  # noqa: E402
from pipeline.shards.writer import ShardInfo  # noqa: E402
from pipeline.table.dataset import Dataset  # noqa: E402
from pipeline.table.errors import CommitConflict


def main(cmd: str, root: str, unit: str, *rest: str) -> int:
    ds = Dataset.open(root)
    if cmd in ("write-forever", "write-then-die"):
        from shards.helpers import provenance, sample, write_unit  # imports torch
    if cmd == "write-forever":
        with ds.writer(unit, provenance(), row_group_bytes=1) as writer:  # a row group per row
            for i in range(10**6):
                writer.write(sample(i, unit))
                if i == 3:
                    print("WRITING", flush=True)
                time.sleep(0.01)
    elif cmd == "write-then-die":
        write_unit(ds, unit, int(rest[0]))
        print("WRITTEN", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # dies between data and manifest
    elif cmd == "race":
        fields = json.loads(unit)
        fields["provenance"] = Provenance.from_dict(fields["provenance"])
        info = ShardInfo(**fields)
        print("READY", flush=True)
        go = Path(rest[0])
        while not go.exists():
            time.sleep(0.005)
        try:
            manifest = ds.commit([info], parent_version=1)
        except CommitConflict as err:
            print(f"CONFLICT {err}", flush=True)
            return 3
        print(f"WON v{manifest.version}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
