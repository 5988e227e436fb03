"""The toy targets' tokenizer: byte-level BPE trained on the synthetic corpus.

It mirrors what real chat models ship: a chat template with system/user/
assistant roles, an end-of-turn token that is also the EOS token, and a reserved
mask token that DFlash/DSpark drafts use for their not-yet-drafted block slots.
The template wraps assistant content in `{% generation %}` markers, so
`apply_chat_template(..., return_assistant_tokens_mask=True)` yields the loss mask.
"""

from __future__ import annotations

from collections.abc import Iterable

END_OF_TEXT = "<|endoftext|>"
TURN_START = "<|im_start|>"
END_OF_TURN = "<|im_end|>"
MASK = "<|mask|>"
SPECIAL_TOKENS = (END_OF_TEXT, TURN_START, END_OF_TURN, MASK)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=None,
        eos_token=END_OF_TURN,
        pad_token=END_OF_TEXT,
        mask_token=MASK,
        additional_special_tokens=[TURN_START],
        model_max_length=4096,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
