"""A vLLM worker that captures hidden states from the target's own forward pass, every step.

Loaded by vLLM itself (`worker_cls`) in every worker process; the owner of the
engine never imports it. The `aux_outputs` capture method (docs/capture.md):

* after the model is loaded, and before vLLM compiles it (the first forward
  of the memory profile), the target is asked for its auxiliary hidden
  states with the interface vLLM's EAGLE-3 support defines
  (`set_aux_hidden_state_layers`): the model then returns the residual
  stream after each requested layer beside its output, from the compiled
  graph (CUDA graphs included on GPUs);
* the runner's `_model_forward` (vLLM's documented override point) takes them
  on their way to the runner, which (told to expect them, as for EAGLE-3)
  gives them to nobody without a speculative config: vLLM schedules, samples
  and decodes exactly as a plain engine, with no speculative method and no
  extra position per request per step;
* the rows of every request that opted in (`SamplingParams.extra_args =
  capture.capture_params(key)`) are gathered on the device (no copy where
  every request captures), copied to CPU and handed to the sink as one chunk
  per step (a spool file holding one block per stream, written straight from
  the model's tensors, or a `CaptureChunk` in the in-process registry),
  before the step's outputs leave the worker. Batch
  order comes from the runner's input batch (request ids, query start
  offsets, tokens computed before this step), so a chunk names positions
  per request exactly as the connector method's chunks do.

Only tensor-parallel rank 0 writes (the states are replicated after the
all-reduce). Pipeline parallelism is not supported by capture.
"""

from __future__ import annotations

import itertools
import os
import types
from typing import Any

import torch
from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
from vllm.model_executor.models.interfaces import supports_eagle3
from vllm.platforms import current_platform

from pipeline.targets.capture import (
    CAPTURE_ARG,
    WORKER_SETTINGS_KEY,
    CaptureChunk,
    put_inprocess,
)
from pipeline.targets.capture_chunks import write_spool_planes

if current_platform.is_cpu():
    from vllm.v1.worker.cpu_worker import CPUWorker as _PlatformWorker
else:
    from vllm.v1.worker.gpu_worker import Worker as _PlatformWorker


class CaptureWorker(_PlatformWorker):
    """The platform's worker, plus capture of the requested residual streams."""

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        settings = (self.vllm_config.additional_config or {}).get(WORKER_SETTINGS_KEY)
        if not settings:
            raise ValueError(f"CaptureWorker needs additional_config[{WORKER_SETTINGS_KEY!r}]")
        runner = self.model_runner
        model = runner.get_model()
        if not supports_eagle3(model):
            raise ValueError(
                f"{type(model).__name__} does not implement vLLM's aux-hidden-state "
                "interface (SupportsEagle3): use capture_method 'extract_hidden_states'"
            )
        model.set_aux_hidden_state_layers(tuple(int(i) for i in settings["aux_layer_ids"]))
        # The runner then unpacks (hidden, aux) itself, in real and dummy runs
        # alike; without a speculative config it hands the aux states to nobody.
        runner.use_aux_hidden_state_outputs = True
        sink = _StepSink(settings, writes=get_tensor_model_parallel_rank() == 0)
        forward = runner._model_forward

        def _model_forward(runner_self, *f_args: Any, **f_kwargs: Any):
            output = forward(*f_args, **f_kwargs)
            if isinstance(output, tuple):  # (hidden_states, [aux state per layer])
                sink.capture(runner_self, output[1])
            return output

        runner._model_forward = types.MethodType(_model_forward, runner)


class _StepSink:
    """Turns one forward's aux states into a `CaptureChunk` for the capturing requests."""

    def __init__(self, settings: dict[str, Any], *, writes: bool) -> None:
        self.transport = settings["transport"]
        self.capture_dir = settings.get("capture_dir")
        self.channel = settings.get("capture_channel")
        self.writes = writes and self.transport != "discard"
        self.writer_id = str(os.getpid())
        self.steps = itertools.count()
        self._keys: dict[str, str | None] = {}  # vLLM request id -> capture key (None: none)

    def capture(self, runner, aux_hidden_states: list[torch.Tensor]) -> None:
        if not self.writes:
            return
        batch = runner.input_batch
        num_reqs = batch.num_reqs
        if num_reqs == 0:
            return
        offsets = runner.query_start_loc.cpu[: num_reqs + 1].tolist()
        computed = batch.num_computed_tokens_cpu[:num_reqs].tolist()
        known = self._keys
        keys = [known[r] if r in known else self._key(runner, r) for r in batch.req_ids[:num_reqs]]
        lengths = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
        if None not in keys and min(lengths) > 0:  # every request captures: one block of rows
            end = offsets[num_reqs]
            planes = [h[:end] for h in aux_hidden_states]
            starts = computed
        else:
            picked = [i for i in range(num_reqs) if keys[i] is not None and lengths[i] > 0]
            if not picked:
                return
            device = aux_hidden_states[0].device
            idx = torch.cat(
                [torch.arange(offsets[i], offsets[i + 1], device=device) for i in picked]
            )
            planes = [h.index_select(0, idx) for h in aux_hidden_states]
            keys = [keys[i] for i in picked]
            starts = [computed[i] for i in picked]
            lengths = [lengths[i] for i in picked]
        step = next(self.steps)
        if planes[0].device.type != "cpu":  # one device-to-host copy, not one per stream
            planes = list(torch.stack(planes).to("cpu").unbind(0))
        if self.transport == "spool":
            # Stream-major, straight from the model's tensors: no copy on the worker.
            write_spool_planes(
                self.capture_dir, self.writer_id, step, keys, starts, lengths, planes
            )
        else:
            rows = torch.stack(planes, dim=1)
            put_inprocess(self.channel, CaptureChunk(step, keys, starts, lengths, rows))

    def _key(self, runner, req_id: str) -> str | None:
        """A request's capture key (looked up once per request, not once per step)."""
        try:
            return self._keys[req_id]
        except KeyError:
            pass
        if len(self._keys) > 2 * len(runner.requests) + 64:  # forget finished requests
            self._keys = {r: k for r, k in self._keys.items() if r in runner.requests}
        state = runner.requests.get(req_id)
        params = getattr(state, "sampling_params", None)
        key = ((params.extra_args or {}) if params is not None else {}).get(CAPTURE_ARG)
        self._keys[req_id] = None if key is None else str(key)
        return self._keys[req_id]
