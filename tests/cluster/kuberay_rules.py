"""The KubeRay operator's own checks that a schema cannot express (KubeRay v1.6.2).

Each rule cites the check in `ray-operator/controllers/ray/utils/validation.go`
(and `constant.go`) that rejects a RayCluster, RayJob or RayCronJob at
reconcile time, after `kubectl apply` has already accepted it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_RAYCLUSTER_NAME = 53  # constant.go MaxRayClusterNameLength
MAX_RAYJOB_NAME = MAX_RAYCLUSTER_NAME - 6  # MaxRayJobNameLength
# A RayCronJob names its RayJobs "<name>-<5 random chars>" (raycronjob_controller.go).
MAX_RAYCRONJOB_NAME = MAX_RAYJOB_NAME - 6
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
RESOURCE_START_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")
CRON_FIELDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


def _qualified_name(key: str) -> bool:
    """Kubernetes IsQualifiedName: [prefix/]name, name <= 63, prefix a DNS subdomain."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(LABEL_NAME.match(name))


def _label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and bool(LABEL_NAME.match(value)))


def _name(meta: dict, limit: int, what: str) -> list[str]:
    name = meta.get("name") or meta.get("generateName", "").rstrip("-") + "-xxxxx"
    problems = []
    if len(name) > limit:
        problems.append(f"{what} name {name!r} is longer than {limit} characters")
    if not DNS1035.match(name):
        problems.append(f"{what} name {name!r} is not a DNS-1035 label")
    return problems


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def cluster_spec_problems(spec: dict[str, Any]) -> list[str]:
    """ValidateRayClusterSpec and its group checks."""
    problems = []
    groups = [("Head", spec["headGroupSpec"])] + [
        (g["groupName"], g) for g in spec.get("workerGroupSpecs", [])
    ]
    autoscaling = spec.get("enableInTreeAutoscaling", False)
    for name, group in groups:
        params = group.get("rayStartParams", {})
        if not group["template"].get("spec", {}).get("containers"):
            problems.append(f"{name} group: no container")
        if any(params.get(k) for k in RESOURCE_START_PARAMS) and group.get("resources"):
            problems.append(f"{name} group: resources in both rayStartParams and resources")
        if "labels" in params:  # validateRayGroupLabels
            problems.append(f"{name} group: rayStartParams['labels'] is not supported; use labels")
        for key, value in group.get("labels", {}).items():
            if not _qualified_name(key) or not _label_value(value):
                problems.append(f"{name} group: invalid Ray node label {key}={value}")
        if name != "Head" and not autoscaling:
            low, high = group.get("minReplicas"), group.get("maxReplicas")
            if low is None or high is None:
                problems.append(f"worker group {name}: minReplicas and maxReplicas must be set")
            elif not 0 <= low <= group.get("replicas", low) <= high:
                problems.append(f"worker group {name}: needs 0 <= min <= replicas <= max")
    auth = spec.get("authOptions", {})
    if auth.get("mode") == "token":
        version = spec.get("rayVersion")
        if not version or _version(version) < (2, 52):
            problems.append("authOptions.mode token needs rayVersion >= 2.52.0")
    return problems


def rayjob_spec_problems(spec: dict[str, Any]) -> list[str]:
    """ValidateRayJobSpec and validateDeletionConfiguration."""
    problems = []
    selector = spec.get("clusterSelector")
    if spec.get("rayClusterSpec") is None and not selector:
        problems.append("one of rayClusterSpec or clusterSelector must be set")
    if selector and spec.get("backoffLimit", 0) > 0:
        problems.append("backoffLimit is incompatible with clusterSelector")
    if spec.get("ttlSecondsAfterFinished", 0) > 0 and not spec.get("shutdownAfterJobFinishes"):
        problems.append("ttlSecondsAfterFinished needs shutdownAfterJobFinishes: true")
    if spec.get("suspend") and not spec.get("shutdownAfterJobFinishes"):
        problems.append("a suspended RayJob needs shutdownAfterJobFinishes: true")
    for key in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if key in spec and spec[key] <= 0:
            problems.append(f"{key} must be positive")
    if spec.get("backoffLimit", 0) < 0:
        problems.append("backoffLimit must be non-negative")
    try:  # UnmarshalRuntimeEnvYAML
        env = yaml.safe_load(spec.get("runtimeEnvYAML", "")) or {}
        if not isinstance(env, dict):
            problems.append("runtimeEnvYAML is not a mapping")
    except yaml.YAMLError as err:
        problems.append(f"runtimeEnvYAML is not YAML: {err}")
    if spec.get("rayClusterSpec") is not None:
        problems += cluster_spec_problems(spec["rayClusterSpec"])
    return problems


def cron_problems(schedule: str) -> list[str]:
    """cron.ParseStandard: five fields of numbers, ranges, lists, steps or '*'."""
    fields = schedule.split()
    if len(fields) != 5:
        return [f"schedule {schedule!r} does not have 5 fields"]
    problems = []
    for text, (low, high) in zip(fields, CRON_FIELDS, strict=True):
        for part in text.split(","):
            base, _, step = part.partition("/")
            if step and not step.isdigit():
                problems.append(f"schedule field {text!r}: bad step")
            if base == "*":
                continue
            bounds = base.split("-")
            if not all(b.isdigit() and low <= int(b) <= high for b in bounds) or len(bounds) > 2:
                problems.append(f"schedule field {text!r} is outside {low}-{high}")
    return problems


def problems(doc: dict[str, Any]) -> list[str]:
    """Every operator-side problem of one manifest (empty: KubeRay accepts it)."""
    kind, meta, spec = doc["kind"], doc.get("metadata", {}), doc.get("spec", {})
    if kind == "RayCluster":
        return _name(meta, MAX_RAYCLUSTER_NAME, kind) + cluster_spec_problems(spec)
    if kind == "RayJob":
        return _name(meta, MAX_RAYJOB_NAME, kind) + rayjob_spec_problems(spec)
    if kind == "RayCronJob":
        return (
            _name(meta, MAX_RAYCRONJOB_NAME, kind)
            + cron_problems(spec["schedule"])
            + [f"jobTemplate: {p}" for p in rayjob_spec_problems(spec["jobTemplate"])]
        )
    if kind == "CronJob":
        return cron_problems(spec["schedule"])
    return []
