from pipeline.corpus.records import Conversation, conversation_hash
from pipeline.regenerate.units import num_buckets_for, plan_units, run_fingerprint


def _convs(n, start=0):
    out = []
    for i in range(start, start + n):
        messages = ({"role": "user", "content": f"question {i}"},)
        out.append(Conversation(conversation_hash(list(messages)), "src", "qa", messages, f"f:{i}"))
    return out


def test_units_are_deterministic_and_cover_every_conversation_once():
    convs = _convs(50)
    a = plan_units(convs, 7, "fp")
    b = plan_units(list(reversed(convs)), 7, "fp")
    assert [(u.unit_id, u.conversations) for u in a] == [(u.unit_id, u.conversations) for u in b]
    members = [c.conversation_id for u in a for c in u.conversations]
    assert sorted(members) == sorted(c.conversation_id for c in convs)
    assert len({u.unit_id for u in a}) == len(a)


def test_unit_id_changes_with_inputs_and_buckets_are_stable_when_corpus_grows():
    convs = _convs(40)
    base = {u.bucket: u for u in plan_units(convs, 8, "fp")}
    other_fp = {u.bucket: u.unit_id for u in plan_units(convs, 8, "fp2")}
    assert all(base[b].unit_id != other_fp[b] for b in base)
    grown = {u.bucket: u for u in plan_units(convs + _convs(1, start=1000), 8, "fp")}
    changed = [b for b in base if grown[b].unit_id != base[b].unit_id]
    assert len(changed) == 1  # only the bucket that received the new conversation
    for b, unit in base.items():
        ids = {c.conversation_id for c in unit.conversations}
        assert ids <= {c.conversation_id for c in grown[b].conversations}


def test_fingerprint_and_bucket_count():
    assert run_fingerprint({"a": 1, "b": [1, 2]}) == run_fingerprint({"b": [1, 2], "a": 1})
    assert run_fingerprint({"a": 1}) != run_fingerprint({"a": 2})
    assert num_buckets_for(0, 64) == 1 and num_buckets_for(129, 64) == 3
