"""Sample identity is stored in every committed dataset: these values were computed by the
functions each package had before `corpus/identity.py` owned them, and must never change."""

from pipeline.corpus.identity import (
    conversation_hash,
    conversation_of,
    hash64,
    input_hash,
    partition_key,
    sample_id,
    unit_interval,
)
from pipeline.corpus.records import Conversation

CHAT = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3? ünïcode"},
    {"role": "assistant", "content": "6"},
]
TOOLS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi", "tools": [{"name": "f"}]},
    {"role": "assistant", "content": "Hello"},
]
CHAT_HASH = "cf0c54131deda9719047283a322be463436a3612e96c151ca943a6466a437ec1"
TOOLS_HASH = "17a05331e7422edf16cc536c6ffef63a2b7b6886c66d0b8b26215d795a7d9b09"
IDS = [
    "cf0c54131deda9719047283a322be463-000",
    "cf0c54131deda9719047283a322be463-001",
    "17a05331e7422edf16cc536c6ffef63a-000",
    "17a05331e7422edf16cc536c6ffef63a-012",
]


def test_conversation_and_sample_ids_are_unchanged():
    assert conversation_hash(CHAT) == CHAT_HASH
    assert conversation_hash(tuple(TOOLS)) == TOOLS_HASH  # a tuple of messages hashes the same
    ids = [sample_id(CHAT_HASH, 0), sample_id(CHAT_HASH, 1)]
    ids += [sample_id(TOOLS_HASH, 0), sample_id(TOOLS_HASH, 12)]
    assert ids == IDS
    conv = Conversation(CHAT_HASH, "src", "chat", tuple(CHAT), "a.jsonl:1")
    assert conv.sample_ids() == IDS[:2]
    assert [conversation_of(s) for s in IDS] == [CHAT_HASH[:32]] * 2 + [TOOLS_HASH[:32]] * 2
    assert conversation_of("nodash") == "nodash"


def test_hashes_keyed_on_ids_are_unchanged():
    keys = [4814963968434478224] * 2 + [8810188311503295618] * 2
    assert [partition_key(s) for s in IDS] == keys
    assert partition_key("nodash") == 7571657434548960260
    assert [input_hash(s, "chat", "src") for s in IDS] == [
        "a83ecfeb1dac0d2c",
        "2ae6d80ec90425f6",
        "38ccc2516999aad5",
        "93649e090c6c265b",
    ]
    assert hash64(CHAT_HASH[:32]) == keys[0]
    assert 0.0 <= unit_interval(IDS[0]) < 1.0


def test_every_stage_derives_the_same_values_through_it():
    from pipeline.corpus.synthetic import conversation_id
    from pipeline.evaluate.calibration import in_calibration_split
    from pipeline.regenerate.driver.partition import (
        conversation_key,
        plan_units,
        planned_sample_ids,
    )
    from pipeline.regenerate.driver.provenance import corpus_version
    from pipeline.shards.sidecar import bucket_of
    from pipeline.table.split import is_heldout
    from pipeline.train.packing import derived_seed

    assert conversation_id(CHAT) == CHAT_HASH[:24]
    assert [is_heldout(s, 0.5) for s in IDS] == [True, True, False, False]
    assert [in_calibration_split(s, 0.5) for s in IDS] == [True, True, True, False]
    assert derived_seed(7, "anchors", 0, IDS[0]) == 8567502803000758049
    assert derived_seed(1, "epoch", 3) == 1816698208953087237
    chat = Conversation(CHAT_HASH, "src", "chat", tuple(CHAT), "a:1")
    tools = Conversation(TOOLS_HASH, "src2", "code", tuple(TOOLS), "b:2")
    assert [conversation_key(chat), conversation_key(tools)] == [
        4814963968434478224,
        8810188311503295618,
    ]
    assert [bucket_of(conversation_key(c), 16) for c in (chat, tools)] == [4, 7]
    assert planned_sample_ids(chat, "all") == IDS[:2]
    assert planned_sample_ids(chat, "last") == IDS[1:2]
    assert [u.unit_id for u in plan_units([chat, tools], 4, "fp")] == ["u0001-d5a1e6742aa4"]
    assert corpus_version([chat, tools]) == "f4b89d2ad41e4ac5"
