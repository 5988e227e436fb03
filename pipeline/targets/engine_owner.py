"""An engine's processes end when the process that started them dies.

vLLM's engine core and its workers are processes of their own. When the
process that started them exits normally, vLLM stops them; when it is killed
(SIGKILL, the OOM killer, a scheduler's hard timeout), nothing does: the
engine core waits on its socket for ever, its worker with it, holding the
model's memory (3.1 GB for SmolLM2-135M on CPU; on a GPU, the device memory the
next run needs). Under Ray a killed replica's children are ended by Ray; a
plain process (`run_local`, the self-prompt sampling in the driver, `verify
--against-target`, the serving bench) had no such guard.

The process that starts engines names itself in `OWNER_ENV`
(`engine_env.apply_engine_env`, `engine_env.launch_env`). Every vLLM process
calls `watch_owner()`, a vLLM general plugin of the project (pyproject.toml's
`vllm.general_plugins`): in any process other than the owner, a daemon thread notes
the parent it was started by and, once that parent is gone (the process was
handed to another), asks the process to stop (SIGTERM, which vLLM's processes
handle by shutting down) and ends it `GRACE_S` later if it has not. Each
level watches its own parent: the engine core its owner, a worker its engine
core. A process whose parent exits normally was being stopped by it anyway.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

OWNER_ENV = "DSPARK_TARGETS_ENGINE_OWNER"
POLL_S = 1.0
GRACE_S = 30.0  # a GPU engine's teardown (device memory) can take a while
_watching = False


def owner_env() -> dict[str, str]:
    """`OWNER_ENV` naming this process, for engines it starts (in it or launched)."""
    return {OWNER_ENV: str(os.getpid())}


def watch_owner(poll_s: float = POLL_S, grace_s: float = GRACE_S) -> bool:
    """In a process an owner started (directly or below), end it when its parent dies.
    False (nothing started): no owner named, this is the owner, or already watching."""
    global _watching
    owner = os.environ.get(OWNER_ENV, "")
    if _watching or not owner.isdigit() or int(owner) == os.getpid():
        return False
    _watching = True
    parent = os.getppid()
    if parent == 1 and owner != "1":  # orphaned before it got here (init is not the owner)
        parent = None
    threading.Thread(
        target=_watch,
        args=(parent, poll_s, grace_s),
        name="engine-owner-watch",
        daemon=True,
    ).start()
    return True


def _watch(parent: int | None, poll_s: float, grace_s: float) -> None:
    """The parent's pid changes only when it dies (the orphan goes to init or a subreaper;
    a parent that is PID 1 itself, as in a container, keeps it while it lives)."""
    while parent is not None and os.getppid() == parent:
        time.sleep(poll_s)
    _stop(grace_s)


def _stop(grace_s: float) -> None:
    print(
        f"dspark-targets: process {os.getpid()} lost the process that started it; stopping",
        file=sys.stderr,
        flush=True,
    )
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os._exit(1)
