"""Rendering and loss masks against the toy target's chat template."""

import pytest
from transformers import AutoTokenizer

from pipeline.render import answer_turns, assemble_row, prompt_messages, render_prompt

CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of Foo?"},
    {"role": "assistant", "content": "It is Bar."},
    {"role": "user", "content": "And its river?"},
    {"role": "assistant", "content": "The Baz."},
]


@pytest.fixture(scope="module")
def tok(random_target_dir):
    return AutoTokenizer.from_pretrained(random_target_dir)


def test_regenerated_history_replaces_original_answers():
    msgs = prompt_messages(CONV, 1, ["It is Qux."])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2]["content"] == "It is Qux." and msgs[-1]["content"] == "And its river?"
    assert prompt_messages(CONV, 1, None)[2]["content"] == "It is Bar."
    assert prompt_messages(CONV, 0, [])[-1]["content"] == "What is the capital of Foo?"
    with pytest.raises(ValueError, match="out of range"):
        prompt_messages(CONV, 2, None)


def test_answer_turns_modes():
    assert answer_turns(CONV, "all") == [0, 1]
    assert answer_turns(CONV, "last") == [1]
    with pytest.raises(ValueError):
        answer_turns(CONV, "first")


def test_loss_mask_equals_the_templates_assistant_span(tok):
    # Render answer 1 given the history, append the answer's tokens + end of turn,
    # and compare with the template's own assistant mask for the last turn.
    regenerated = ["It is Qux."]
    prompt = render_prompt(tok, prompt_messages(CONV, 1, regenerated))
    answer = "The river Baz."
    output = tok(answer)["input_ids"] + [tok.eos_token_id]
    row = assemble_row(prompt, output)

    full = prompt_messages(CONV, 1, regenerated) + [{"role": "assistant", "content": answer}]
    enc = tok.apply_chat_template(
        full, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    # The template adds "\n" after the end-of-turn token: that is not the answer's.
    ids, mask = (
        enc["input_ids"][: len(row.input_ids)],
        list(enc["assistant_masks"][: len(row.input_ids)]),
    )
    last_turn_start = len(prompt)
    assert ids == row.input_ids
    assert row.loss_mask[last_turn_start:] == mask[last_turn_start:] == [1] * len(output)
    assert sum(row.loss_mask) == row.num_generated_tokens == len(output)
    assert row.num_prompt_tokens == len(prompt)


def test_prompt_must_not_end_with_the_answer(tok):
    with pytest.raises(ValueError, match="must not end with an assistant"):
        render_prompt(tok, CONV)
    with pytest.raises(ValueError, match="no tokens"):
        assemble_row([1, 2], [])
