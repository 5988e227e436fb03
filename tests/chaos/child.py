"""Subprocess side of the chaos tests (run as a script, not collected by pytest).

python child.py write-big ROOT UNIT     write 4096-token samples to one shard until killed
python child.py run CONFIG_JSON TTL_S   a whole regeneration (run_local), lease TTL TTL_S
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for shards.helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository


def main(cmd: str, *args: str) -> int:
    if cmd == "write-big":
        from shards.helpers import provenance, sample

        from pipeline.table.dataset import Dataset

        root, unit = args
        ds = Dataset.open(root)
        with ds.writer(unit, provenance(), row_group_bytes=2 << 20) as writer:
            for i in range(10**6):
                writer.write(sample(i, unit, num_tokens=4096))
                print(f"WROTE {i}", flush=True)
                time.sleep(0.02)
    elif cmd == "run":
        import torch

        from pipeline.table import lease

        torch.set_num_threads(1)  # as the chaos suite's own process (conftest.py)

        lease.DEFAULT_TTL_S = float(args[1])
        lease.CLOCK_MARGIN_S = 1.0
        from pipeline.regenerate.config import parse_config
        from pipeline.regenerate.run import run_local

        config = parse_config(json.loads(args[0]), "chaos child")
        summary = run_local(config)
        print(f"DONE version={summary.version}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
