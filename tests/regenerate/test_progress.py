"""The progress bar counts the answers the run will regenerate, not every assistant turn.

In process (`run_local`, transformers backend): with `turns: last` a
multi-turn conversation is one answer; a rerun on a grown corpus counts only
the conversations no version holds yet.
"""

from __future__ import annotations

import json

import pytest

from pipeline.regenerate import run as run_module
from pipeline.regenerate.config import parse_config
from pipeline.regenerate.run import run_local
from pipeline.torch_threads import torch_threads


@pytest.fixture
def bars(monkeypatch):
    """Every progress bar a run opens: [total, answers counted by its updates]."""
    opened: list[list[int]] = []
    real = run_module.Progress

    class Counting(real):
        def __init__(self, total: int, enabled: bool) -> None:
            super().__init__(total, enabled)
            opened.append([total, 0])

        def update(self, num_answers, result) -> None:
            opened[-1][1] += num_answers
            super().update(num_answers, result)

    monkeypatch.setattr(run_module, "Progress", Counting)
    return opened


def _conversation(i: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"Where is city {i}?"},
            {"role": "assistant", "content": "Far away."},
            {"role": "user", "content": "How far?"},
        ]
    }


def _config(corpus, uri, turns):
    return parse_config(
        {
            "target": {
                "model": "toy:trained",
                "backend": "hf",
                "dtype": "float32",
                "max_model_len": 256,
                "aux_layer_ids": [1, 3],
            },
            "corpus": {"sources": [{"path": str(corpus), "name": "cities"}]},
            "generation": {"temperature": 0.0, "max_new_tokens": 4},
            "output": {"uri": str(uri)},
            "regenerate": {"turns": turns, "conversations_per_unit": 2, "min_answer_tokens": 2},
        },
        "test",
    )


@pytest.mark.parametrize("turns", ["last", "all"])
def test_the_bar_totals_the_answers_this_run_regenerates(tmp_path, bars, turns):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(_conversation(i)) + "\n" for i in range(3)))
    per_conversation = 1 if turns == "last" else 2  # two assistant turns in each
    with torch_threads(1):
        first = run_local(_config(corpus, tmp_path / "ds", turns))
        assert bars == [[3 * per_conversation, 3 * per_conversation]]
        assert first.samples == 3 * per_conversation  # the total is what the run made
        # Two more conversations: only they are regenerated, and only they are counted.
        with corpus.open("a") as fh:
            fh.writelines(json.dumps(_conversation(i)) + "\n" for i in (3, 4))
        run_local(_config(corpus, tmp_path / "ds", turns))
    assert bars[1] == [2 * per_conversation, 2 * per_conversation]
