"""Cross-check the offline tau against vLLM's own acceptance counters at temperature 0.

`check_against_vllm` is the stage's step (the `vllm:` section of the
evaluation config): vLLM serves the draft's export with the method its
format names (`speculators_model_type`; a fill-in DSpark draft's export is its
DFlash backbone with its heads beside, which vLLM's CPU build runs, heads
included through the project's plugin, pipeline/drafts/vllm_plugin.py).

vLLM decodes the evaluation prompts with the exported draft as its
speculative decoder (one fresh engine in a child process, via
`pipeline.drafts.vllm_check.decode`; counters read before and after and
subtracted, as they are cumulative). The offline walk then runs on exactly
the trajectories vLLM produced: the HF reference target captures their
features (fp32, as the fp32 engine's drafter reads them), and the same draft
weights draft offline. Both sides therefore walk the same tokens, and tau
must agree within the stated tolerance:

    |tau_vllm - tau_offline| / tau_offline <= tolerance (default 3%)

What may still differ: (1) in the last round of each request vLLM verifies
drafted tokens past the end-of-turn token against the target's continuation,
which no trajectory holds (offline counts them as rejected); (2) fp32
kernel differences between vLLM's CPU attention and transformers' can flip
a near-tied argmax of the draft. With R requests and N rounds (1) is at most
n*R/N; the report gives it beside the measured gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.drafts.registry import drafts_with_heads, served_method

if TYPE_CHECKING:
    from pipeline.drafts.drafter import Drafter
    from pipeline.drafts.load import LoadedDraft
    from pipeline.evaluate.config import VllmCheckConfig
    from pipeline.shards.reader import TrainingSample


@dataclass
class VllmComparison:
    method: str
    draft_dir: str
    num_prompts: int
    generated_tokens: int
    vllm_tau: float
    vllm_num_drafts: int
    vllm_position_rate: list[float]  # (n,) share of rounds that accepted >= k tokens
    offline_tau: float
    offline_rounds: int
    offline_position_rate: list[float]  # (n,) same, from the offline walk
    tolerance: float  # relative
    end_effect_bound: float  # n * requests / rounds: the most the last rounds can explain
    seconds: float

    @property
    def relative_gap(self) -> float:
        return abs(self.vllm_tau - self.offline_tau) / self.offline_tau

    @property
    def within_tolerance(self) -> bool:
        return self.relative_gap <= self.tolerance

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "draft_dir": self.draft_dir,
            "num_prompts": self.num_prompts,
            "generated_tokens": self.generated_tokens,
            "vllm_tau": round(self.vllm_tau, 4),
            "vllm_num_drafts": self.vllm_num_drafts,
            "offline_tau": round(self.offline_tau, 4),
            "offline_rounds": self.offline_rounds,
            "vllm_position_rate": [round(x, 4) for x in self.vllm_position_rate],
            "offline_position_rate": [round(x, 4) for x in self.offline_position_rate],
            "relative_gap": round(self.relative_gap, 4),
            "tolerance": self.tolerance,
            "within_tolerance": self.within_tolerance,
            "end_effect_bound": round(self.end_effect_bound, 4),
            "seconds": round(self.seconds, 1),
        }


def capture_samples(
    target_dir: str,
    aux_layer_ids: tuple[int, ...],
    prompts: list[list[int]],
    outputs: list[list[int]],
) -> list[TrainingSample]:
    """Samples (fp32 features) of the given trajectories, captured by the HF reference."""
    import torch

    from pipeline.shards.reader import TrainingSample
    from pipeline.targets.base import Generation
    from pipeline.targets.config import TargetConfig
    from pipeline.targets.hf_backend import HFTarget

    target = HFTarget(
        TargetConfig(
            model=target_dir, backend="hf", dtype="float32", aux_layer_ids=list(aux_layer_ids)
        ),
        target_dir,
    )
    samples = []
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        if len(output) < 2:
            continue
        gen = Generation(f"vllm-{i}", list(prompt), list(output), "stop")
        states = target.capture(gen).rows.states()
        ids = torch.tensor(list(prompt) + list(output))
        samples.append(
            TrainingSample(
                sample_id=f"vllm-{i}",
                source="vllm",
                domain="all",
                input_ids=ids,
                loss_mask=torch.tensor([0] * len(prompt) + [1] * len(output), dtype=torch.bool),
                hidden_states=states.hidden_states,
                last_hidden_state=states.last_hidden_state,
                finish_reason=gen.finish_reason,
                num_prompt_tokens=len(prompt),
                num_generated_tokens=len(output),
            )
        )
    target.close()
    return samples


def compare_with_vllm(
    *,
    target_dir: str,
    draft_dir: Path,
    drafter: Drafter,
    prompts: list[list[int]],
    method: str | None = None,
    max_tokens: int = 160,
    tolerance: float = 0.03,
    gpu_memory_utilization: float = 0.2,
    max_model_len: int = 1024,
    timeout_s: float = 900,
) -> VllmComparison:
    """Decode with vLLM + draft, then walk the same trajectories offline (module docstring)."""
    import time

    import torch

    from pipeline.drafts.vllm_check import decode, export_method
    from pipeline.evaluate.offline import build_tables, tau, walk_tables

    method = method or export_method(draft_dir)
    started = time.perf_counter()
    n = drafter.num_draft_tokens
    run = decode(
        target_dir,
        prompts,
        max_tokens=max_tokens,
        draft_dir=draft_dir,
        method=method,
        num_speculative_tokens=n,
        dtype="float32",
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        timeout_s=timeout_s,
    )
    samples = capture_samples(target_dir, drafter.model.spec.aux_layer_ids, prompts, run.outputs)
    rounds = walk_tables(build_tables(samples, drafter), num_draft_tokens=n)
    k = torch.arange(1, n + 1)
    offline_rate = (rounds.accepted[:, None] >= k).float().mean(0).tolist()
    per_pos = run.accepted_per_pos or [0] * n
    return VllmComparison(
        method=method,
        draft_dir=str(draft_dir),
        num_prompts=len(prompts),
        generated_tokens=sum(len(o) for o in run.outputs),
        vllm_tau=run.tau,
        vllm_num_drafts=run.num_drafts,
        vllm_position_rate=[
            c / run.num_drafts if run.num_drafts else float("nan") for c in per_pos
        ],
        offline_tau=tau(accepted=rounds.accepted),
        offline_rounds=rounds.num_rounds,
        offline_position_rate=offline_rate,
        tolerance=tolerance,
        end_effect_bound=n * len(samples) / max(rounds.num_rounds, 1),
        seconds=time.perf_counter() - started,
    )


def check_against_vllm(
    config: VllmCheckConfig, draft: LoadedDraft, prompts: list[list[int]], target_dir: str
) -> VllmComparison:
    """Serve `draft`'s export with vLLM (the method its format names, unless `config.method`
    says) and compare with the offline walk of the same weights on vLLM's trajectories."""
    import json

    from pipeline.drafts.load import make_drafter

    if draft.export_dir is None:
        raise ValueError(f"vllm.draft {config.draft!r} has no export directory to serve")
    exported = json.loads((draft.export_dir / "config.json").read_text())
    served = served_method(exported, str(draft.export_dir))
    method = config.method or served
    if method != served:
        raise ValueError(
            f"vllm.method {method!r} cannot serve {draft.export_dir}, a "
            f"{exported['speculators_model_type']} export of the "
            f"{draft.spec.kind} draft {config.draft!r}: leave vllm.method unset"
        )
    # Offline as vLLM drafts: a DSpark draft's dflash export with its heads where the plugin
    # serves them, else its backbone.
    drafter = make_drafter(
        config.draft, draft, use_heads=drafts_with_heads(exported, str(draft.export_dir))
    )
    return compare_with_vllm(
        target_dir=target_dir,
        draft_dir=draft.export_dir,
        drafter=drafter,
        prompts=prompts,
        method=method,
        max_tokens=config.max_tokens,
        tolerance=config.tolerance,
        gpu_memory_utilization=config.gpu_memory_utilization,
        max_model_len=config.max_model_len,
        timeout_s=config.timeout_s,
    )
