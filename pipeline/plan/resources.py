"""What a config will ask of the cluster, in words (the first part of `dspark-targets plan`)."""

from __future__ import annotations

from pipeline.regenerate.config import PipelineConfig


def describe_resources(config: PipelineConfig) -> str:
    rep = config.replicas
    lines = [f"target: {config.target.model} via {config.target.backend} ({config.target.dtype})"]
    if rep.placement is not None:
        p = rep.placement
        per = ", ".join(f"{k}={v:g}" for k, v in p.bundle.items())
        sel = (
            f", bundles pinned by labels {p.bundle_label_selector}"
            if p.bundle_label_selector
            else ""
        )
        lines.append(
            f"replicas: {rep.num_replicas} x placement group of {p.num_bundles} bundles "
            f"({per}) {p.strategy}{sel}"
        )
        if p.domains:
            lines.append(
                f"placement: replica i on nodes labelled {p.domain_label}=<domains[i]> "
                f"({', '.join(p.domains)}); waits up to {p.timeout_s:g} s, never spills"
            )
        gpus = rep.num_replicas * p.num_bundles * p.bundle.get("GPU", 0.0)
    else:
        lines.append(f"replicas: {rep.num_replicas} x (CPU={rep.num_cpus:g}, GPU={rep.num_gpus:g})")
        gpus = rep.num_replicas * rep.num_gpus
    lines.append(f"total GPUs requested: {gpus:g}")
    lines.append(f"ray: {config.ray.address or 'local (started by the job)'}")
    lines.append(f"output: {config.output.uri} (codec {config.output.codec})")
    from pipeline.redact import redact

    return redact("\n".join(lines))
