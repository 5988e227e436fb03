import json

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


# --------------------------------------------------------------------------- shapes users bring

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
# The normalised form of one agentic exchange, whatever shape it came in.
AGENTIC = [
    {"role": "system", "content": "You can call tools.", "tools": [WEATHER_TOOL]},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": '{"temp": 18}'},
    {"role": "assistant", "content": "18 degrees in Paris."},
]


def test_plain_conversations_keep_their_hashes():
    # Committed datasets are keyed by these: the normalised form of plain
    # {role, content} conversations must never change.
    from pipeline.corpus.identity import conversation_hash

    plain = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
        ]
    }
    sharegpt = {
        "conversations": [
            {"from": "human", "value": "Caf\u00e9 \u00fcber na\u00efve \u4e2d\u6587 \U0001f600"},
            {"from": "gpt", "value": "ok"},
        ]
    }
    assert (
        conversation_hash(to_messages(plain))
        == "11e06c45da99428aabf82c417dd84e221b5c535b0f5cf6815095482aed8cc19c"
    )
    assert (
        conversation_hash(to_messages(sharegpt))
        == "9b2f59677c393a01bbabf674275b38364a46cc655e19752b824985392c0ddc90"
    )
    # One text part is the plain string: the same conversation, the same id.
    parts = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "4"}]},
        ]
    }
    assert to_messages(parts) == to_messages(plain)


def test_content_parts_developer_role_and_leading_system_turns():
    msgs = to_messages(
        {
            "messages": [
                {"role": "developer", "content": "Be terse."},
                {"role": "system", "content": "Answer in French."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Describe"},
                        "this",
                        {"type": "input_text", "text": "please"},
                    ],
                },
            ]
        }
    )
    assert msgs == [
        {"role": "system", "content": "Be terse.\n\nAnswer in French."},
        {"role": "user", "content": "Describe\nthis\nplease"},
    ]


def test_non_text_parts_are_an_error_or_skipped_and_counted():
    from collections import Counter

    row = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
                    {"type": "text", "text": "What is this?"},
                ],
            }
        ]
    }
    with pytest.raises(MalformedRow) as err:
        to_messages(row)
    assert err.value.reason == "non_text_part" and "image_url" in err.value.detail
    skipped = Counter()
    assert to_messages(row, non_text_parts="skip", skipped=skipped) == [
        {"role": "user", "content": "What is this?"}
    ]
    assert skipped == {"image_url": 1}
    only_image = {"messages": [{"role": "user", "content": row["messages"][0]["content"][:1]}]}
    with pytest.raises(MalformedRow) as err:
        to_messages(only_image, non_text_parts="skip")
    assert err.value.reason == "empty_content"


def test_openai_tool_calls_legacy_function_calls_and_sharegpt_tools_normalise_alike():
    openai = {
        "messages": [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "content": '{"temp": 18}'},
            {"role": "assistant", "content": "18 degrees in Paris."},
        ],
        "tools": [WEATHER_TOOL],
    }
    legacy = {
        "messages": [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {"role": "function", "content": '{"temp": 18}'},
            {"role": "assistant", "content": "18 degrees in Paris."},
        ],
        "tools": json.dumps([WEATHER_TOOL]),
    }
    sharegpt = {  # LLaMA-Factory's ShareGPT: function_call/observation turns, system + tools columns
        "system": "You can call tools.",
        "tools": json.dumps([WEATHER_TOOL]),
        "conversations": [
            {"from": "human", "value": "Weather in Paris?"},
            {
                "from": "function_call",
                "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}),
            },
            {"from": "observation", "value": '{"temp": 18}'},
            {"from": "gpt", "value": "18 degrees in Paris."},
        ],
    }
    for row in (openai, legacy, sharegpt):
        assert to_messages(row) == AGENTIC, row


def test_tool_call_ids_names_and_unparsable_arguments_are_kept():
    msgs = to_messages(
        {
            "messages": [
                {"role": "user", "content": "Run it"},
                {
                    "role": "assistant",
                    "content": "Running.",
                    "tool_calls": [
                        {"id": "call_1", "function": {"name": "sh", "arguments": "ls -la"}},
                        {"id": "call_2", "name": "py", "arguments": {"code": "1+1"}},
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "name": "sh", "content": ""},
                {"role": "tool", "tool_call_id": "call_2", "content": {"result": 2}},
            ]
        }
    )
    assert msgs[1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "sh", "arguments": "ls -la"}},
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "py", "arguments": {"code": "1+1"}},
        },
    ]
    assert msgs[2] == {"role": "tool", "content": "", "tool_call_id": "call_1", "name": "sh"}
    assert msgs[3] == {"role": "tool", "content": '{"result": 2}', "tool_call_id": "call_2"}


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"text": "<|im_start|>user\nhi<|im_end|>"}, "pre_rendered_text"),
        ({"messages": [{"role": "user", "content": "a\ud800b"}]}, "lone_surrogate"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "content_not_text",
        ),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]},
            "tool_result_without_call",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "", "tool_calls": "get_weather()"},
                ]
            },
            "bad_tool_call",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"function": {"name": ""}}],
                    },
                ]
            },
            "bad_tool_call",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]},
                    {"role": "user", "content": "again"},
                ]
            },
            "tool_call_without_result",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]},
                    {"role": "tool", "content": "r"},
                    {"role": "user", "content": "no answer after the tool result"},
                ]
            },
            "roles_do_not_alternate",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "system", "content": "late"},
                ]
            },
            "system_turn_not_first",
        ),
        ({"conversations": [{"from": "function_call", "value": "not json"}]}, "bad_tool_call"),
        ({"messages": [{"role": "user", "content": "q"}], "tools": "not json"}, "bad_tools"),
        (
            {
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"name": "f", "arguments": "[" * 200 + "]" * 200}],
                    },
                    {"role": "tool", "content": "r"},
                ]
            },
            "too_deeply_nested",
        ),
    ],
)
def test_malformed_new_shapes_name_their_reason(row, reason):
    with pytest.raises(MalformedRow) as err:
        to_messages(row)
    assert err.value.reason == reason, err.value
    assert err.value.detail
