from pipeline.corpus.identity import conversation_hash
from pipeline.corpus.records import Conversation
from pipeline.regenerate.driver.partition import num_buckets_for, plan_units, run_fingerprint


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


def test_buckets_never_depend_on_corpus_size_and_units_are_chunked():
    from pipeline.regenerate.driver.partition import conversation_key
    from pipeline.shards.sidecar import bucket_of

    convs = _convs(300)
    for conv in convs[:20]:
        bucket = bucket_of(conversation_key(conv), 16)
        (unit,) = [
            u for u in plan_units([conv] + _convs(5, 5000), 16, "fp") if conv in u.conversations
        ]
        assert unit.bucket == bucket  # the same bucket whatever else is planned with it
    units = plan_units(convs, 4, "fp", conversations_per_unit=10)
    assert all(len(u.conversations) <= 10 for u in units)
    assert sorted(c.conversation_id for u in units for c in u.conversations) == sorted(
        c.conversation_id for c in convs
    )
    assert len({u.unit_id for u in units}) == len(units)


def test_diff_finds_new_changed_and_removed_samples():
    import dataclasses

    from pipeline.regenerate.driver.partition import diff_corpus, sample_inputs

    convs = _convs(10)
    live = {}
    for i, conv in enumerate(convs):
        for sid, h in sample_inputs(conv, "all").items():
            live[sid] = (f"shards/s{i % 2}.parquet", h)
    grown = convs[:8] + _convs(3, start=100)  # 2 removed, 3 new
    grown[0] = dataclasses.replace(grown[0], domain="math")  # 1 changed (same id, other input)
    diff = diff_corpus(grown, live, "all")
    assert len(diff.new) == 3 and len(diff.changed) == 1 and len(diff.removed) == 2
    assert diff.unchanged == 7 and len(diff.todo) == 4
    (changed,) = diff.changed
    assert diff.replaced == {changed: live[changed][0]}
    assert sum(len(v) for v in diff.tombstones.values()) == 2
    plain = diff_corpus(grown, live, "all", apply_changes=False)  # regenerate: new ones only
    assert len(plain.todo) == 3 and plain.tombstones == {} and plain.replaced == {}
    assert diff_corpus(convs, live, "all").todo == []  # nothing changed: nothing to do
