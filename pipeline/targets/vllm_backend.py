"""vLLM backend: the production implementation of `TargetBackend` and `CapturingBackend`.

One instance owns one engine (one target replica). Prompts go in as token ids
(the project renders chat templates itself, so the token ids that are stored
are exactly the ones the engine saw) and results come back keyed by the
project's request ids, never by vLLM's per-engine counters.

With `capture=True` the engine runs vLLM's `extract_hidden_states`
speculative method plus the project's connector, so generation and hidden-state
capture happen in one pass (docs/capture.md); such an engine also serves plain
`generate` calls, at the cost of the method's extra draft position per step.
"""

from __future__ import annotations

import logging
import os
import shutil
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.logs import kv
from pipeline.targets.base import (
    Generation,
    GenerationRequest,
    RequestFailure,
    Result,
    request_seed,
    run_all,
)
from pipeline.targets.capture_rows import CaptureContract, PieceRows, RowLayout, SpooledRows
from pipeline.targets.config import GenerationConfig, TargetConfig
from pipeline.targets.engine_env import apply_engine_env
from pipeline.targets.spool_dirs import child_pids, make_spool_dir, record_engine_segments

log = logging.getLogger(__name__)


def engine_kwargs(config: TargetConfig, model_dir: str) -> dict[str, Any]:
    """Arguments for `vllm.LLM` from a TargetConfig (engine_kwargs override the rest)."""
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "revision": config.revision,
        "dtype": config.dtype,
        "max_model_len": config.max_model_len,
        "tensor_parallel_size": config.tensor_parallel_size,
        "enable_expert_parallel": config.enable_expert_parallel,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "enforce_eager": config.enforce_eager,
        # Generation defaults come from our config, not the checkpoint's file.
        "generation_config": "vllm",
        "seed": 0,
    }
    kwargs.update(config.engine_kwargs)
    return kwargs


class VLLMTarget:
    """One vLLM engine; with `capture=True` it implements `CapturingBackend` too."""

    def __init__(self, config: TargetConfig, model_dir: str, capture: bool = False) -> None:
        from vllm import LLM

        self.config = config
        self.capture = capture
        self._rows_handed_off = False  # hand_off_rows
        apply_engine_env()  # before vLLM loads its plugins here (engine_owner.py)
        kwargs = engine_kwargs(config, model_dir)
        if capture:
            self._setup_capture(config, model_dir, kwargs)
        log.info(
            "starting vLLM engine %s", kv(model=model_dir, dtype=config.dtype, capture=capture)
        )
        before = child_pids() if capture else set()
        self.llm = LLM(**kwargs)
        if capture:  # what a SIGKILL would leave in /dev/shm, listed where cleanup finds it
            record_engine_segments(self.spool_dir, before)
        self.eos_id = self.llm.get_tokenizer().eos_token_id
        self._in_flight: dict[str, tuple[GenerationRequest, bool]] = {}

    def _setup_capture(self, config: TargetConfig, model_dir: str, kwargs: dict[str, Any]) -> None:
        """Capture engine arguments, layer ids, the final norm and this engine's spool dir."""
        import torch

        from pipeline.targets import capture
        from pipeline.targets.resolve import target_shape

        shape = target_shape(model_dir, config.revision, config.aux_layer_ids)
        num_layers = shape.num_layers
        self.aux_layer_ids, self.hidden_size = shape.aux_layer_ids, shape.hidden_size
        # Host memory a request's captured rows take per token (k aux streams + the final one).
        self.capture_bytes_per_token = (
            (len(self.aux_layer_ids) + 1) * self.hidden_size * getattr(torch, config.dtype).itemsize
        )
        self.dtype = getattr(torch, config.dtype)
        norm_weight, norm_eps = capture.load_final_norm(model_dir, config.revision)
        self.layout = RowLayout(
            len(self.aux_layer_ids),
            self.hidden_size,
            config.dtype,
            norm_weight.to(self.dtype),
            norm_eps,
        )
        for key in ("speculative_config", "kv_transfer_config", "worker_cls", "additional_config"):
            if key in kwargs:
                raise ValueError(
                    f"target {config.model}: engine_kwargs.{key} conflicts with capture "
                    "(the capture engine sets it); remove it from the target config"
                )
        if kwargs.get("enable_prefix_caching"):
            log.warning(
                "enable_prefix_caching is ignored by the capture engine "
                "(capture with prefix-cache hits is not verified; docs/capture.md)"
            )
        kwargs["enable_prefix_caching"] = False
        self.spool_dir = make_spool_dir()  # tmpfs where there is one; a killed run's removed
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.spool_dir, True)
        transport = os.environ.get("DSPARK_CAPTURE_TRANSPORT", "spool")
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        if transport == "inprocess" and (not in_process or config.tensor_parallel_size > 1):
            raise ValueError(
                "DSPARK_CAPTURE_TRANSPORT=inprocess needs VLLM_ENABLE_V1_MULTIPROCESSING=0 and "
                "tensor_parallel_size 1 (the worker must run in this process); use 'spool'"
            )
        sink = self.sink = capture.SinkSpec(transport, self.spool_dir)
        # Aux id L (the last layer's output, before the final norm) gives the
        # final hidden state once the norm is applied here.
        engine_aux_ids = [*self.aux_layer_ids, num_layers]
        self.capture_method = config.capture_method
        if config.capture_method == "aux_outputs":
            kwargs.update(capture.worker_engine_kwargs(sink, engine_aux_ids))
        else:
            kwargs["speculative_config"] = capture.speculative_config(engine_aux_ids)
            kwargs["kv_transfer_config"] = capture.kv_transfer_config(transport, self.spool_dir)
        self.reader = capture.CaptureReader(sink)
        self.assembler = capture.CaptureAssembler()
        _export_package_path()

    def hand_off_rows(self, enabled: bool = True) -> CaptureContract | None:
        """From now on `poll` leaves captured rows in the spool (`SpooledRows` handles).

        The returned contract lets another process (the replica's write-back)
        read the spool and build the tensors itself, so the engine owner's
        process never touches the captured bytes. None (and no change) when
        rows cannot cross processes: no capture, or the in-process transport.
        `enabled=False` takes them back (the reader must be done with the spool).
        """
        if not enabled:
            self._rows_handed_off = False
            return None
        if not self.capture or self.sink.transport != "spool":
            return None
        self._rows_handed_off = True
        return CaptureContract(self.sink, self.layout)

    def sampling_params(
        self,
        request: GenerationRequest,
        params: GenerationConfig,
        extra_args: dict[str, Any] | None = None,
    ):
        from vllm import SamplingParams

        return SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=request.max_new_tokens or params.max_new_tokens,
            seed=request_seed(params.seed, request.request_id),
            stop_token_ids=[self.eos_id],
            # Keep the end-of-turn token: the draft learns to predict it too.
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            detokenize=False,
            extra_args=extra_args,
        )

    # ------------------------------------------------------------------ streaming

    @property
    def max_concurrency(self) -> int:
        """Requests the engine schedules at once (vLLM's `max_num_seqs`)."""
        return int(self.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs)

    def submit(
        self, request: GenerationRequest, params: GenerationConfig, *, capture: bool = True
    ) -> None:
        """Queue one request in the engine; it runs alongside everything already in flight."""
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        from pipeline.targets.capture import capture_params

        capture = capture and self.capture
        if request.request_id in self._in_flight:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        sampling = self.sampling_params(
            request,
            params,
            capture_params(request.request_id, self.capture_method) if capture else None,
        )
        sampling.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request
        self.llm.llm_engine.add_request(
            request.request_id, TokensPrompt(prompt_token_ids=list(request.prompt_ids)), sampling
        )
        self._in_flight[request.request_id] = (request, capture)

    def num_unfinished(self) -> int:
        return len(self._in_flight)

    def poll(self) -> list[Result]:
        """One engine step; the requests that finished in it, each with its rows handle.

        Every row of a finished request is in the capture sink before its output
        is emitted (the connector copies inside the step), so the sink is
        drained only when a capturing request finished; rows of requests still
        running wait in the assembler. Nothing is built here: the handle's
        `states()` runs wherever its sample is built (the write-back).
        """
        finished = [o for o in self.llm.llm_engine.step() if o.finished]
        if not finished:
            return []
        handed_off = self._rows_handed_off
        if not handed_off and any(self._in_flight[o.request_id][1] for o in finished):
            chunks = self.reader.take_chunks()
            self.layout.norm_final(chunks)  # once per step, not per sample
            self.assembler.add(chunks)
        per_token = self.capture_bytes_per_token if self.capture else 0
        results: list[Result] = []
        for out in finished:
            request, capture = self._in_flight.pop(out.request_id)
            completion = out.outputs[0]
            rid, prompt_ids = request.request_id, list(request.prompt_ids)
            output_ids = list(completion.token_ids)
            finish = "stop" if completion.finish_reason == "stop" else "length"
            if not capture:
                results.append(Generation(rid, prompt_ids, output_ids, finish))
                continue
            num_tokens = len(prompt_ids) + len(output_ids)
            nbytes = num_tokens * per_token
            if handed_off:  # whoever holds the contract reads the rows (hand_off_rows)
                rows = SpooledRows(rid, num_tokens, self.spool_dir, nbytes)
            else:
                parts = self.assembler.take_parts(rid)
                rows = PieceRows(rid, num_tokens, parts, self.layout, nbytes) if parts else None
            try:
                if self.capture_method == "extract_hidden_states":
                    echoed = (out.kv_transfer_params or {}).get("capture_key")
                    if echoed != rid:
                        raise RuntimeError(f"the output echoes capture key {echoed!r}")
                if rows is None:
                    raise RuntimeError("no hidden states were captured")
            except RuntimeError as err:
                results.append(RequestFailure(rid, "capture_incomplete", str(err), rows))
                continue
            results.append(Generation(rid, prompt_ids, output_ids, finish, rows))
        return results

    def generate(
        self, requests: Sequence[GenerationRequest], params: GenerationConfig
    ) -> list[Generation]:
        return run_all(self, requests, params, capture=False)

    def generate_and_capture(
        self, requests: Sequence[GenerationRequest], params: GenerationConfig
    ) -> list[Generation]:
        """Generate and capture in one engine pass; results in request order, rows built.

        Rows follow the `CapturedStates` contract: T = prompt + output, row t
        = states when token t was fed, row T-1 zero (the last token is never fed;
        the engine's row there, if any, belongs to a throw-away draft token).
        """
        if not self.capture:
            raise TypeError(
                "this vLLM target was loaded without capture; use load_target(config, capture=True)"
            )
        return run_all(self, requests, params, capture=True)

    def close(self) -> None:
        import gc

        shutdown_engine(self.llm)
        del self.llm
        gc.collect()
        if self.capture:
            self._cleanup()


def shutdown_engine(llm: Any) -> None:
    """Stop an `LLM`'s engine-core and worker processes now. Dropping the last reference
    is not enough: measured in bench/regenerate.py, a deleted engine's processes (and the
    host memory its KV cache reserves) stayed up beside the next engine."""
    llm.llm_engine.engine_core.shutdown()


def _export_package_path() -> None:
    """Make `pipeline` importable in vLLM's engine-core and worker processes.

    vLLM imports the connector by module path in every process that builds one.
    Spawned children inherit `sys.path` through multiprocessing, but not every
    launcher does (vLLM's Ray executor starts workers as Ray actors): putting the
    package root on `PYTHONPATH` covers children started by any launcher on this
    node. Ray workers on other nodes need the job's `working_dir`/`py_modules`
    or the package installed there (docs/capture.md).
    """
    root = str(Path(__file__).resolve().parents[2])
    current = os.environ.get("PYTHONPATH", "")
    if root not in current.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, current) if p)
