"""Training shards from the Hugging Face reference target, for tests, the bench and the demo.

Until the vLLM regeneration stage (pipeline/regenerate.py) produces shards,
this writes the same schema v1 from the transformers reference: the target
answers each conversation's first prompt greedily (or the corpus answer is
kept), then one forward pass over prompt + answer with
`output_hidden_states=True` gives the captured layers. Layer convention
(DESIGN.md §3): aux id k = HF `hidden_states[k]` (stream after k decoder
layers) for k < L, and `last_hidden_state` = HF `hidden_states[L]`, which is
already after the final norm.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

from pipeline.logs import kv
from pipeline.threads import torch_threads

log = logging.getLogger(__name__)

DEFAULT_AUX_LAYER_IDS = (1, 2, 3)


def file_hash(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        if path.exists():
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def write_reference_shards(
    uri: str | Path,
    *,
    target: str = "toy:trained",
    num_conversations: int = 120,
    corpus_seed: int = 0,
    aux_layer_ids: Sequence[int] = DEFAULT_AUX_LAYER_IDS,
    num_units: int = 2,
    regenerate: bool = True,
    max_new_tokens: int = 160,
    codec: str = "bf16",
    batch_size: int = 32,
    endpoint_url: str | None = None,
    num_threads: int | None = 1,
) -> int:
    """Write `num_units` shards of first-turn samples and commit them; return the version.

    `num_threads` caps torch's threads while this runs: on a small shared
    machine OpenMP spin-waiting made 2 threads ~40x slower than 1 (measured).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline import __version__
    from pipeline.corpus.synthetic import CORPUS_VERSION, SyntheticCorpusConfig, generate
    from pipeline.render import first_prompt, render_prompt
    from pipeline.shards.manifest import Dataset
    from pipeline.shards.schema import Provenance
    from pipeline.shards.writer import Sample
    from pipeline.targets.resolve import resolve_model

    with torch_threads(num_threads):
        model_dir = Path(resolve_model(target))
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        num_layers = model.config.num_hidden_layers
        if any(not 0 <= k < num_layers for k in aux_layer_ids):
            raise ValueError(
                f"aux_layer_ids {list(aux_layer_ids)} must lie in [0, {num_layers}) for {target} "
                f"({num_layers} layers; the final stream is stored separately, after the norm)"
            )
        convs, seen = [], set()
        for conv in generate(
            SyntheticCorpusConfig(num_conversations=num_conversations, seed=corpus_seed)
        ):
            if conv["id"] not in seen:  # the synthetic corpus repeats a few short conversations
                seen.add(conv["id"])
                convs.append(conv)
        prompts = [render_prompt(tokenizer, first_prompt(c["messages"])) for c in convs]
        if regenerate:
            answers = _greedy(model, tokenizer, prompts, max_new_tokens, batch_size)
        else:
            answers = []
            for conv, prompt in zip(convs, prompts, strict=True):
                full = tokenizer.apply_chat_template(
                    conv["messages"][: len(first_prompt(conv["messages"])) + 1],
                    tokenize=True,
                    return_dict=True,
                )["input_ids"]
                answers.append((list(full[len(prompt) :]), "stop"))

        provenance = Provenance(
            target_name=target,
            target_revision=file_hash(*sorted(model_dir.glob("*.safetensors"))),
            tokenizer_hash=file_hash(
                model_dir / "tokenizer.json", model_dir / "chat_template.jinja"
            ),
            aux_layer_ids=tuple(aux_layer_ids),
            hidden_size=model.config.hidden_size,
            codec=codec,
            corpus_version=f"synthetic-v{CORPUS_VERSION}-seed{corpus_seed}-n{num_conversations}",
            code_version=f"dspark-targets {__version__} (pipeline.toy.reference_shards, HF reference)",
            generation={"backend": "hf", "temperature": 0.0, "max_new_tokens": max_new_tokens}
            if regenerate
            else {"backend": "corpus answers"},
        )
        dataset = Dataset.open(uri, endpoint_url=endpoint_url)
        infos = []
        per_unit = -(-len(convs) // num_units)
        for unit in range(num_units):
            chunk = range(unit * per_unit, min(len(convs), (unit + 1) * per_unit))
            with dataset.writer(f"ref-{unit:04d}", provenance) as writer:
                for i in chunk:
                    output, finish = answers[i]
                    if not output:
                        continue
                    ids = prompts[i] + output
                    with torch.no_grad():
                        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
                    hs = out.hidden_states
                    writer.write(
                        Sample(
                            sample_id=f"{convs[i]['id']}.0",
                            source="synthetic",
                            domain=convs[i]["domain"],
                            input_ids=ids,
                            loss_mask=[0] * len(prompts[i]) + [1] * len(output),
                            hidden_states=torch.cat(
                                [hs[k][0] for k in aux_layer_ids], -1
                            ).bfloat16(),
                            last_hidden_state=hs[num_layers][0].bfloat16(),
                            finish_reason=finish,
                            num_prompt_tokens=len(prompts[i]),
                            num_generated_tokens=len(output),
                        )
                    )
            infos.append(writer.info)
        manifest = dataset.commit(infos)
        log.info(
            "reference shards committed %s",
            kv(uri=dataset.uri, version=manifest.version, rows=manifest.num_rows),
        )
        return manifest.version


def _greedy(model, tokenizer, prompts, max_new_tokens: int, batch_size: int):
    """Greedy answers, batched with left padding; (tokens incl. eos, finish_reason) each."""
    import torch

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    answers = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        for row in out[:, width:].tolist():
            if eos in row:
                answers.append((row[: row.index(eos) + 1], "stop"))
            else:
                answers.append((row, "length"))
    return answers
