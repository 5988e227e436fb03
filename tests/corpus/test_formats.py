import pytest

from pipeline.corpus.formats import MalformedRow, to_messages


def test_openai_sharegpt_and_pairs_normalise_to_the_same_messages():
    expected = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
    rows = [
        {
            "messages": [
                {"role": "user", "content": "What is 2+2? "},
                {"role": "assistant", "content": "4"},
            ]
        },
        {
            "conversations": [
                {"from": "human", "value": "What is 2+2?"},
                {"from": "gpt", "value": " 4\n"},
            ]
        },
        {"prompt": "What is 2+2?", "response": "4"},
        {"prompt": "What is 2+2?", "completion": "4"},
        {"question": "What is 2+2?", "answer": "4"},
        {"instruction": "What is 2+2?", "output": "4"},
    ]
    for row in rows:
        assert to_messages(row) == expected, row


def test_system_turn_input_field_and_prompt_only():
    msgs = to_messages(
        {
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "Hi"},
            ]
        }
    )
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert (
        to_messages({"instruction": "Translate", "input": "hola", "output": "hello"})[0]["content"]
        == "Translate\n\nhola"
    )
    assert to_messages({"prompt": "Tell me a joke"}) == [
        {"role": "user", "content": "Tell me a joke"}
    ]


def test_unicode_is_nfc_normalised():
    decomposed = "Cafe\u0301"
    assert to_messages({"prompt": decomposed, "response": "ok"})[0]["content"] == "Caf\u00e9"


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"foo": 1}, "unknown_format"),
        ({"messages": "hello"}, "not_a_list"),
        ({"messages": []}, "empty_conversation"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "unknown_role"),
        ({"messages": [{"role": "user", "content": "  "}]}, "empty_content"),
        ({"messages": [{"role": "user", "content": 3}]}, "content_not_text"),
        ({"messages": ["hi"]}, "bad_turn"),
        ({"messages": [{"role": "assistant", "content": "x"}]}, "roles_do_not_alternate"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
            "roles_do_not_alternate",
        ),
        ({"messages": [{"role": "system", "content": "a"}]}, "no_user_turn"),
    ],
)
def test_malformed_rows_name_their_reason(row, reason):
    with pytest.raises(MalformedRow) as err:
        to_messages(row)
    assert err.value.reason == reason
    assert err.value.detail
