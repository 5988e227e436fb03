"""Reference shards come from the regeneration stage itself (hf backend, in process)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from pipeline.corpus.ingest import load_corpus
from pipeline.demo.reference_shards import reference_config, write_reference_shards
from pipeline.table.dataset import Dataset
from pipeline.table.reader import ShardReader


def test_reference_shards_follow_the_capture_convention_and_resume(tmp_path, trained_target_dir):
    uri = tmp_path / "ref"
    options = dict(num_conversations=8, num_units=2, max_new_tokens=24)
    assert write_reference_shards(uri, **options) == 1
    config = reference_config(uri, **options)
    expected = {sid for c in load_corpus(config.corpus).conversations for sid in c.sample_ids()}
    rows = list(ShardReader(str(uri), prefetch=0))
    assert sorted(r.sample_id for r in rows) == sorted(expected)  # every turn, each once
    prov = Dataset.open(uri).manifest().provenance
    assert prov.aux_layer_ids == (1, 2, 3) and prov.generation["backend"] == "hf"

    model = AutoModelForCausalLM.from_pretrained(trained_target_dir, dtype=torch.float32).eval()
    for row in rows[:4]:
        ids = row.input_ids.long()
        with torch.no_grad():
            hs = model(input_ids=ids[None, :-1], output_hidden_states=True).hidden_states
        want = torch.cat([hs[a][0] for a in prov.aux_layer_ids], -1).to(torch.bfloat16)
        assert torch.equal(row.hidden_states[:-1], want)
        assert torch.equal(row.last_hidden_state[:-1], hs[-1][0].to(torch.bfloat16))
        # The last token is never fed to the target: its row is zero (schema v1).
        assert not row.hidden_states[-1].any() and not row.last_hidden_state[-1].any()

    # A second call finds every unit committed and publishes nothing new.
    assert write_reference_shards(uri, **options) == 1
