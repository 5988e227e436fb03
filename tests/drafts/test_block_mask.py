"""The shared layers' `flex` block attention: the compiled flex_attention is what runs,
and a compiler failure falls back to eager flex with one warning."""

from __future__ import annotations

import dataclasses
import logging

import torch
from draft_specs import tiny_spec
from torch.nn.attention.flex_attention import flex_attention

from pipeline.drafts.block_mask import CompiledFlex, build_block_mask, compiled_flex
from pipeline.drafts.dspark.model import DSparkDraft
from pipeline.drafts.inputs import DraftInputs


def _inputs(spec) -> DraftInputs:
    """One row: a 10-token sample with blocks at anchors 3 and 6."""
    g = torch.Generator().manual_seed(0)
    tc, b = 10, spec.block_size
    kh = len(spec.aux_layer_ids) * spec.target_hidden_size
    return DraftInputs(
        ctx_features=torch.randn(1, tc, kh, generator=g),
        ctx_positions=torch.arange(tc)[None],
        ctx_doc=torch.zeros(1, tc, dtype=torch.long),
        block_ids=torch.randint(4, spec.vocab_size, (1, 2, b), generator=g),
        block_anchor=torch.tensor([[3, 6]]),
        block_doc=torch.zeros(1, 2, dtype=torch.long),
        prev_ids=torch.randint(4, spec.vocab_size, (1, 2, b), generator=g),
    )


def _attend(attn, spec, inputs, mask) -> torch.Tensor:
    r, nb, b = inputs.block_ids.shape
    g = torch.Generator().manual_seed(1)
    x = torch.randn(r, nb * b, spec.hidden_size, generator=g)
    ctx = torch.randn(r, inputs.ctx_doc.shape[1], spec.hidden_size, generator=g)
    positions = (inputs.block_anchor[:, :, None] + torch.arange(b)).view(r, nb * b)
    with torch.no_grad():  # flex_attention has no CPU backward, compiled or not
        return attn(x, positions, ctx, inputs.ctx_positions, mask)


def test_the_flex_path_calls_the_compiled_flex_attention():
    spec = tiny_spec()
    torch.manual_seed(0)
    attn = DSparkDraft(spec, torch.randn(50, 32), torch.randn(50, 32)).layers[0].self_attn
    inputs = _inputs(spec)
    mask = build_block_mask(inputs, "flex")
    # The forward dispatches to the process's CompiledFlex, a torch.compile of flex_attention.
    assert mask.flex_fn is compiled_flex()
    assert mask.flex_fn.compiled("cpu")._torchdynamo_orig_callable is flex_attention
    # Whether inductor's C++ build succeeds depends on the host; what the forward calls
    # does not. A backend that records the graphs Dynamo hands it shows the compiled
    # function is the one called.
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    mask.flex_fn = CompiledFlex(backend=recording_backend)
    got = _attend(attn, spec, inputs, mask)
    assert mask.flex_fn.failure is None and graphs, "the flex path did not go through Dynamo"
    want = _attend(attn, spec, inputs, build_block_mask(inputs, "eager"))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # With the process's own (inductor) compile: the same values, and a second shape
    # recompiles and is still right (dynamic shapes were not, on CPU).
    got = _attend(attn, spec, inputs, build_block_mask(inputs, "flex"))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    wide = dataclasses.replace(
        inputs,
        block_ids=inputs.block_ids.repeat(1, 2, 1),
        block_anchor=torch.tensor([[3, 6, 8, 9]]),
        block_doc=torch.zeros(1, 4, dtype=torch.long),
        prev_ids=inputs.prev_ids.repeat(1, 2, 1),
    )
    got = _attend(attn, spec, wide, build_block_mask(wide, "flex"))
    want = _attend(attn, spec, wide, build_block_mask(wide, "eager"))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _no_compiler(gm, example_inputs):
    raise RuntimeError("no C++ compiler on this host")  # the injected fault


def test_a_compiler_failure_falls_back_to_eager_flex_with_one_warning(caplog):
    spec = tiny_spec()
    torch.manual_seed(0)
    attn = DSparkDraft(spec, torch.randn(50, 32), torch.randn(50, 32)).layers[0].self_attn
    inputs = _inputs(spec)
    mask = build_block_mask(inputs, "flex")
    mask.flex_fn = CompiledFlex(backend=_no_compiler)
    with caplog.at_level(logging.WARNING, logger="pipeline.drafts.common"):
        first = _attend(attn, spec, inputs, mask)
        second = _attend(attn, spec, inputs, mask)
    warned = [r for r in caplog.records if "flex runs uncompiled" in r.getMessage()]
    assert len(warned) == 1 and "no C++ compiler" in warned[0].getMessage()
    assert "no C++ compiler" in mask.flex_fn.failure
    want = _attend(attn, spec, inputs, build_block_mask(inputs, "eager"))
    torch.testing.assert_close(first, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second, want, atol=1e-5, rtol=1e-5)
