"""DSpark served with its heads where vLLM has no DSpark path: a vLLM general plugin.

vLLM's own `dspark` method lives in its Model Runner V2, which needs Triton;
the CPU build runs the older runner, whose `DFlashProposer` serves a DSpark
draft's backbone only. A DSpark draft of the fill-in layout exports as
`dflash` with its whole DSpark form in a folder beside (`dspark_heads` in
config.json, pipeline/drafts/dspark/export.py), which vLLM's dflash loader
never reads. This plugin, loaded by vLLM in every engine process through the
`vllm.general_plugins` entry point, gives `DFlashProposer` those heads:

* after the draft loads, the heads of its DSpark form (if it has one) are read;
* drafting then samples the K slots left to right instead of in one call:
  slot k's logits are the backbone's plus the Markov bias `W2(W1[prev])`,
  `prev` the anchor (the target's token the block starts from) for the first
  slot and the token just drafted after it, exactly as the project's drafter
  (pipeline/drafts/dspark/drafter.py) drafts offline.

The same plugin applies adaptive drafting in vLLM's model runner, for every
draft (pipeline/drafts/vllm_adaptive.py; the rule: pipeline/drafts/adaptive.py).

A draft without a DSpark form is served as vLLM serves it. The patch is pinned
to the vLLM versions in `SUPPORTED_VLLM` (constraints.txt's): on any other
version the plugin logs one line and leaves vLLM alone, and `require_support`
refuses to serve heads in one line.

`DRAFT_LOG_ENV` (a path) logs one JSON line per request and round (request
id, anchor position, anchor, drafted tokens): how the tests check that vLLM
drafts what the project's drafter drafts. `ROUND_TIMES_ENV` (a path) logs the
wall time of every drafting round of any draft with its requests: the served
cost of one round (bench/draft_study.py).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from pipeline.drafts.vllm_adaptive import patch_adaptive

log = logging.getLogger(__name__)

# The vLLM versions whose DFlashProposer this plugin is written against.
SUPPORTED_VLLM = ("0.32.0",)
DRAFT_LOG_ENV = "DSPARK_TARGETS_DRAFT_LOG"
ROUND_TIMES_ENV = "DSPARK_TARGETS_ROUND_TIMES"
_PATCHED = "_dspark_targets_patched"  # on the patched class
_HEADS = "_dspark_heads"  # a proposer's ServedHeads (None: a draft without heads)


def vllm_version() -> str | None:
    try:
        import vllm
    except ImportError:
        return None
    return vllm.__version__


def supports(version: str | None) -> bool:
    """Whether the plugin serves DSpark's heads on this vLLM version."""
    return version is not None and version.split("+")[0] in SUPPORTED_VLLM


def require_support(version: str | None = None) -> None:
    """Raise (one line) unless the plugin serves DSpark's heads on this vLLM."""
    version = version if version is not None else vllm_version()
    if not supports(version):
        raise RuntimeError(
            f"dspark-targets serves DSpark's heads in vLLM {', '.join(SUPPORTED_VLLM)} only, "
            f"not {version or 'without vLLM'}: install a supported vLLM, or serve the draft's "
            "backbone (vLLM's dflash method without the plugin)"
        )


class ServedHeads:
    """A DSpark draft's Markov (and confidence) heads beside vLLM's DFlash model."""

    def __init__(self, tensors: dict, *, d2t, device, dtype, with_markov: bool = True) -> None:
        self.w1 = tensors["markov_head.markov_w1.weight"].to(device, dtype)  # (V, r)
        self.w2 = tensors["markov_head.markov_w2.weight"].to(device, dtype)  # (Vd, r)
        conf = "confidence_head.proj.weight"
        has_conf = conf in tensors
        self.conf_w = tensors[conf].to(device).float() if has_conf else None  # (1, d [+ r])
        self.conf_b = tensors["confidence_head.proj.bias"].to(device).float() if has_conf else None
        self.with_markov = with_markov
        # vLLM's d2t: target id = draft id + d2t[draft id] (None: the full vocabulary).
        self.d2t = d2t

    @classmethod
    def from_draft_dir(cls, draft_dir: str, *, d2t, device, dtype) -> ServedHeads | None:
        path = Path(draft_dir) / "config.json"
        if not path.exists():
            return None
        heads = json.loads(path.read_text()).get("dspark_heads")
        if not heads:
            return None
        require_support()
        from safetensors import safe_open

        from pipeline.drafts.dspark.export import HEAD_PREFIXES

        with safe_open(str(Path(draft_dir) / heads["file"]), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys() if k.startswith(HEAD_PREFIXES)}
        with_markov = bool(heads.get("confidence_head_with_markov", True))
        return cls(tensors, d2t=d2t, device=device, dtype=dtype, with_markov=with_markov)

    def to_target(self, ids):
        return ids if self.d2t is None else ids + self.d2t[ids]

    def bias(self, embedded):
        """(B, r) W1 rows of the previous tokens -> (B, Vd) fp32 Markov logit bias."""
        return (embedded @ self.w2.T).float()

    def confidence(self, hidden, embedded):
        """(B, d) slot hidden states, (B, r) W1 rows -> (B,) the chance the slot is accepted
        (None without a confidence head)."""
        if self.conf_w is None:
            return None
        import torch

        feats = hidden.float()
        if self.with_markov:
            feats = torch.cat([feats, embedded.float()], dim=-1)
        return torch.sigmoid(feats @ self.conf_w.T + self.conf_b).squeeze(-1)


def _draft_logits(proposer, hidden):
    """(N, d) -> (N, Vd) the backbone's logits over the draft vocabulary."""
    model = proposer.model
    return model.logits_processor(model.lm_head, hidden)


def _sample_with_heads(proposer, hidden, sampling_metadata):
    """The K slots of every request drafted left to right with the Markov bias; the
    DFlash proposer's `_sample_draft_tokens` contract: (B*K,) ids, request-major, and
    the drafted distributions (B*K, V) when sampling is probabilistic."""
    import torch

    heads: ServedHeads = getattr(proposer, _HEADS)
    k = proposer.num_speculative_tokens
    base = _draft_logits(proposer, hidden).float()
    base = base.view(-1, k, base.shape[-1])  # (B, K, Vd)
    greedy = not proposer._enable_probabilistic_draft_probs or sampling_metadata.all_greedy
    prev = proposer._dspark_anchors[: base.shape[0]]
    slot_hidden = hidden.view(base.shape[0], k, -1)
    tokens, probs, chance = [], [], []
    targets = None
    for slot in range(k):
        embedded = heads.w1[prev]  # (B, r)
        logits = base[:, slot] + heads.bias(embedded)
        chance.append(heads.confidence(slot_hidden[:, slot], embedded))
        if greedy:
            tok = heads.to_target(logits.argmax(-1))
        else:
            if targets is None:
                vd = logits.shape[-1]
                targets = heads.to_target(torch.arange(vd, device=logits.device))
            full = logits.new_full((logits.shape[0], proposer.vocab_size), float("-inf"))
            full[:, targets] = logits
            tok, p = proposer._sample_from_logits(full, sampling_metadata)
            probs.append(p)
        tokens.append(tok)
        prev = tok
    ids = torch.stack(tokens, 1)  # (B, K)
    proposer._dspark_confidence = None if chance[0] is None else torch.stack(chance, 1)
    _log_drafts(proposer, ids)
    return ids.reshape(-1), (torch.stack(probs, 1).flatten(0, 1) if probs else None)


def _log_drafts(proposer, ids) -> None:
    path = os.environ.get(DRAFT_LOG_ENV)
    if not path:
        return
    k = ids.shape[1]
    req_ids = getattr(proposer, "_dspark_req_ids", None) or []
    anchors = proposer._dspark_anchors[: ids.shape[0]].tolist()
    positions = proposer.positions[: ids.shape[0] * (1 + k) : 1 + k].tolist()
    with open(path, "a") as f:
        for row, drafted in enumerate(ids.tolist()):
            rid = req_ids[row] if row < len(req_ids) else None
            line = {"req": rid, "pos": positions[row], "anchor": anchors[row], "tokens": drafted}
            f.write(json.dumps(line) + "\n")


def _patch_round_times(cls, path: str) -> None:
    """Every drafting round's wall time, appended to `path` (ROUND_TIMES_ENV)."""
    import time

    propose = cls.propose_draft_token_ids

    def timed(self, scheduler_output, *args, **kwargs):
        started = time.perf_counter()
        out = propose(self, scheduler_output, *args, **kwargs)
        ms = (time.perf_counter() - started) * 1e3
        with open(path, "a") as f:
            requests = len(scheduler_output.num_scheduled_tokens)
            skipped = getattr(self.drafter, "_dspark_skipped", False)
            f.write(json.dumps({"ms": ms, "requests": requests, "skipped": skipped}) + "\n")
        return out

    cls.propose_draft_token_ids = timed


def _patch(cls) -> None:
    load_model = cls.load_model
    propose = cls.propose
    sample = cls._sample_draft_tokens

    def load_model_with_heads(self, target_model):
        load_model(self, target_model)
        model = self.model
        setattr(
            self,
            _HEADS,
            ServedHeads.from_draft_dir(
                self.draft_model_config.model,
                d2t=getattr(model, "draft_id_to_target_id", None),
                device=self.device,
                dtype=self.dtype,
            ),
        )
        if getattr(self, _HEADS) is not None:
            log.info("dspark-targets: DSpark heads loaded from %s", self.draft_model_config.model)

    def propose_with_anchors(self, *args, **kwargs):
        # propose(num_speculative_tokens, target_token_ids, target_positions,
        #         target_hidden_states, next_token_ids, ...)
        self._dspark_anchors = kwargs.get("next_token_ids", args[4] if len(args) > 4 else None)
        return propose(self, *args, **kwargs)

    def sample_draft_tokens(self, hidden, sampling_metadata):
        if getattr(self, _HEADS, None) is None or self.use_heterogeneous_vocab:
            return sample(self, hidden, sampling_metadata)
        return _sample_with_heads(self, hidden, sampling_metadata)

    cls.load_model = load_model_with_heads
    cls.propose = propose_with_anchors
    cls._sample_draft_tokens = sample_draft_tokens
    setattr(cls, _PATCHED, True)


def register() -> bool:
    """vLLM's `vllm.general_plugins` entry point: patch DFlashProposer (once per process).
    False, with one log line, on a vLLM version the patch is not written against."""
    version = vllm_version()
    if not supports(version):
        log.warning(
            "dspark-targets: vLLM %s is not one the DSpark-heads plugin supports (%s); "
            "DSpark drafts are served as their DFlash backbone",
            version,
            ", ".join(SUPPORTED_VLLM),
        )
        return False
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if not getattr(DFlashProposer, _PATCHED, False):
        patch_adaptive(SpecDecodeBaseProposer, GPUModelRunner)
        _patch(DFlashProposer)
        if os.environ.get(ROUND_TIMES_ENV):
            _patch_round_times(GPUModelRunner, os.environ[ROUND_TIMES_ENV])
    return True
