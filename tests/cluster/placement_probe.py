"""A replica actor without an engine, for placement tests: it reports where it runs.

`start_replicas(..., actor_class=PlacementProbe)` places it exactly as it
places `RegenerateReplica` (same options, same placement group, bundle 0);
`ready()` answers with the node it landed on and the placement group Ray says
it belongs to, which is the one vLLM would take for its workers.
"""

from __future__ import annotations

import os
from typing import Any


class PlacementProbe:
    def __init__(self, target: Any, regenerate: Any) -> None:
        self.model = target.model

    def ready(self) -> dict[str, Any]:
        import ray
        from ray.util import get_current_placement_group

        pg = get_current_placement_group()
        return {
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "placement_group": pg.id.hex() if pg is not None else None,
            "units_wanted": 1,
            "max_requests_in_flight": 1,
        }

    def close(self) -> None:
        return None
