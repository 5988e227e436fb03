"""One sample shape from the engine to the shard: `PendingSample` over a rows handle.

The regeneration path has one pending-sample type and one rows interface,
so nothing in it dispatches on what kind of sample or rows it holds.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import torch
from shards.helpers import HIDDEN, LAYERS, activations

from pipeline.regenerate.replica.pending import PendingSample
from pipeline.targets.base import CapturedStates, Generation, HeldRows

ROOT = Path(__file__).resolve().parents[3]
# The shapes a row had before it had one, and the shapes it has now.
OLD = {
    "CapturedGeneration",
    "PendingCapture",
    "SpooledCapture",
    "DeferredSample",
    "SpooledSample",
    "WritebackSettings",
}
SHAPES = OLD | {"Sample", "PendingSample", "HeldRows", "PieceRows", "SpooledRows", "Generation"}


def _pending(prompt: int = 3, answer: int = 4) -> PendingSample:
    T = prompt + answer
    rows = HeldRows(
        CapturedStates(activations(T, HIDDEN * len(LAYERS), 1), activations(T, HIDDEN, 2))
    )
    gen = Generation("c-1:0", list(range(prompt)), list(range(10, 10 + answer)), "stop", rows)
    return PendingSample("src", "qa", gen)


def test_a_pending_sample_builds_its_shard_row():
    pending = _pending()
    assert pending.sample_id == "c-1:0"
    assert pending.nbytes == 7 * (len(LAYERS) + 1) * HIDDEN * 2  # bf16 rows
    row = pickle.loads(pickle.dumps(pending)).build()  # plain data: it crosses processes
    assert list(row.input_ids) == [0, 1, 2, 10, 11, 12, 13]
    assert list(row.loss_mask) == [0, 0, 0, 1, 1, 1, 1]
    assert (row.num_prompt_tokens, row.num_generated_tokens) == (3, 4)
    assert row.source == "src" and row.domain == "qa" and row.finish_reason == "stop"
    assert torch.equal(row.hidden_states, pending.generation.rows.states().hidden_states)
    assert row.last_hidden_state.dtype == torch.bfloat16


def _modules(*packages: str):
    for package in packages:
        for path in sorted((ROOT / "pipeline" / package).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _names(node: ast.AST) -> set[str]:
    return {
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Name | ast.Attribute)
    }


def test_no_dispatch_on_sample_or_rows_shapes_and_no_capability_lookups():
    found = []
    for path, tree in _modules("regenerate", "targets"):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            if node.func.id == "isinstance" and _names(node.args[1]) & SHAPES:
                found.append(f"{path.name}:{node.lineno} isinstance on {ast.unparse(node.args[1])}")
            if node.func.id in ("getattr", "hasattr") and len(node.args) > 1:
                arg = node.args[1]
                if isinstance(arg, ast.Constant) and arg.value in ("hand_off_rows", "pid"):
                    found.append(f"{path.name}:{node.lineno} {node.func.id}({arg.value!r})")
    assert not found, found


def test_the_old_shapes_are_gone():
    defined = [
        f"{path.relative_to(ROOT)}: {node.name}"
        for path, tree in _modules("regenerate", "targets", "shards")
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name in OLD
    ]
    assert not defined, defined
    assert not any(
        "captured_sample" in _names(tree) for _, tree in _modules("regenerate")
    )  # the write-back no longer calls back into the unit
