"""Every YAML under cluster/: schema (k8s_schema.yaml, from the KubeRay v1.6.2 CRDs), the
operator's own checks (kuberay_rules.py), and what the project needs of them: racks that
match the replica placement, credentials only from Secrets, shared memory for the capture
spool, entrypoints that name real modules and configs that load."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from kuberay_rules import problems as kuberay_problems

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
SCHEMA = yaml.safe_load((Path(__file__).with_name("k8s_schema.yaml")).read_text())
LAUNCHER = CLUSTER / "ray-cluster-launcher-gb300.yaml"
GB300 = [
    "raycluster-gb300-nvl72.yaml",
    "rayjob-regenerate-gb300.yaml",
    "rayjob-refresh-gb300.yaml",
    "raycronjob-refresh-gb300.yaml",
]
RACK_CONFIG = ROOT / "jobs/configs/moe-2p8t-gb300.yaml"
# The config loader each command calls on --config.
LOADERS = {
    "regenerate": ("pipeline.regenerate.config", "load_config"),
    "refresh": ("pipeline.regenerate.config", "load_config"),
    "train": ("pipeline.train.config", "load_train_config"),
    "evaluate": ("pipeline.evaluate.config", "load_eval_config"),
}
CREDENTIAL = re.compile(r"(^|_)(SECRET|TOKEN|PASSWORD|ACCESS_KEY|CREDENTIALS?)(_|$)", re.I)


def manifests() -> list[tuple[str, dict]]:
    """(file name, document) of every Kubernetes object under cluster/."""
    out = []
    for path in sorted(CLUSTER.glob("*.yaml")):
        if path == LAUNCHER:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            out.append((path.name, doc))
    return out


def cluster_spec(doc: dict) -> dict | None:
    spec = doc.get("spec", {})
    if doc["kind"] == "RayCluster":
        return spec
    if doc["kind"] == "RayJob":
        return spec.get("rayClusterSpec")
    if doc["kind"] == "RayCronJob":
        return spec["jobTemplate"].get("rayClusterSpec")
    return None


def job_specs() -> list[tuple[str, dict]]:
    """(file name, RayJobSpec) of every RayJob and RayCronJob template."""
    out = []
    for name, doc in manifests():
        if doc["kind"] == "RayJob":
            out.append((name, doc["spec"]))
        elif doc["kind"] == "RayCronJob":
            out.append((name, doc["spec"]["jobTemplate"]))
    return out


def schema_errors(doc: dict) -> list[str]:
    key = f"{doc.get('apiVersion')}/{doc.get('kind')}"
    if key not in SCHEMA["kinds"]:
        return [f"no schema for {key}"]
    root = {**SCHEMA, **SCHEMA["kinds"][key]}
    validator = jsonschema.Draft202012Validator(root)
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in validator.iter_errors(doc)
    ]


def containers(spec: dict) -> list[dict]:
    groups = [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_every_manifest_validates_against_its_crd_schema_and_kuberays_checks():
    docs = manifests()
    kinds = {doc["kind"] for _, doc in docs}
    assert {"RayCluster", "RayJob", "RayCronJob", "CronJob"} <= kinds
    for name, doc in docs:
        errors = schema_errors(doc) + kuberay_problems(doc)
        assert not errors, f"{name} ({doc['kind']}): " + "; ".join(errors)


def test_the_checks_reject_what_kubernetes_and_kuberay_reject():
    _, cluster = next((n, d) for n, d in manifests() if d["kind"] == "RayCluster")
    bad = copy.deepcopy(cluster)
    group = bad["spec"]["workerGroupSpecs"][0]
    group["rayStartParams"]["num-gpus"] = 4  # map[string]string: an int is refused
    group["replica"] = 3  # typo of a field: unknown fields are errors
    errors = schema_errors(bad)
    assert any("rayStartParams/num-gpus" in e for e in errors)
    assert any("'replica' was unexpected" in e for e in errors)
    bad = copy.deepcopy(cluster)
    bad["spec"]["workerGroupSpecs"][0]["rayStartParams"]["labels"] = "nvlink_domain=rack-01"
    assert any("use labels" in p for p in kuberay_problems(bad))
    job = {"kind": "RayJob", "metadata": {"name": "x"}, "spec": {"ttlSecondsAfterFinished": 60}}
    found = kuberay_problems(job)
    assert any("rayClusterSpec or clusterSelector" in p for p in found)
    assert any("needs shutdownAfterJobFinishes" in p for p in found)


def test_gb300_manifests_carry_one_cluster_spec_with_a_worker_group_per_placement_domain():
    from pipeline.regenerate.config import load_config

    replicas = load_config(RACK_CONFIG).replicas
    placement = replicas.placement
    specs = {}
    for name in GB300:
        (doc,) = yaml.safe_load_all((CLUSTER / name).read_text())
        specs[name] = cluster_spec(doc)
    reference = specs[GB300[0]]
    for name, spec in specs.items():
        assert spec == reference, f"{name}: rayClusterSpec differs from {GB300[0]}'s spec"
    groups = {g["labels"][placement.domain_label]: g for g in reference["workerGroupSpecs"]}
    assert set(placement.domains) <= set(groups), (placement.domains, sorted(groups))
    for domain in placement.domains:
        group = groups[domain]
        (tray,) = group["template"]["spec"]["containers"]
        gpus_per_tray = int(tray["resources"]["limits"]["nvidia.com/gpu"])
        cpus_per_tray = float(tray["resources"]["limits"]["cpu"])
        # The rack holds exactly one replica's placement group.
        assert group["replicas"] * gpus_per_tray == placement.num_bundles * placement.bundle["GPU"]
        bundles_per_tray = gpus_per_tray / placement.bundle["GPU"]
        assert bundles_per_tray * placement.bundle["CPU"] <= cpus_per_tray
        # The pods of a group are pinned to their rack's Kubernetes nodes.
        assert group["template"]["spec"]["nodeSelector"], domain


def test_credentials_come_only_from_secrets():
    for name, doc in manifests():
        spec = cluster_spec(doc)
        if spec is None:
            continue
        for container in containers(spec):
            for env in container.get("env", []):
                if CREDENTIAL.search(env["name"]):
                    assert "value" not in env, f"{name}: {env['name']} is set inline"
            refs = [e.get("secretRef", {}).get("name") for e in container.get("envFrom", [])]
            assert "dspark-object-store" in refs, f"{name}: {container['name']} has no store Secret"
    for name, job in job_specs():
        env_vars = (yaml.safe_load(job.get("runtimeEnvYAML", "")) or {}).get("env_vars", {})
        assert not [k for k in env_vars if CREDENTIAL.search(k)], f"{name}: runtimeEnvYAML"


def test_gpu_workers_mount_memory_backed_shared_memory():
    for name, doc in manifests():
        spec = cluster_spec(doc)
        for group in (spec or {}).get("workerGroupSpecs", []):
            pod = group["template"]["spec"]
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for container in pod["containers"]:
                shm = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
                assert shm, f"{name}/{group['groupName']}: no /dev/shm mount"
                assert volumes[shm[0]["name"]]["emptyDir"]["medium"] == "Memory"


def test_jobs_resume_after_a_failure_and_clean_up():
    for name, job in job_specs():
        assert job["backoffLimit"] >= 1, f"{name}: no job-level retry (a retry resumes)"
        assert job["submitterConfig"]["backoffLimit"] >= 1, name
        assert job["shutdownAfterJobFinishes"] and job["ttlSecondsAfterFinished"] > 0, name
        env = yaml.safe_load(job["runtimeEnvYAML"])
        assert env["working_dir"] == "/app", f"{name}: the connector must reach every node"


@pytest.mark.parametrize("name,job", job_specs(), ids=[f"{n}" for n, _ in job_specs()])
def test_entrypoint_is_a_pipeline_command_that_parses_with_a_config_that_loads(name, job):
    from pipeline.cli import cli

    argv = shlex.split(job["entrypoint"])
    # One command surface: every job runs `python -m pipeline <command>`.
    assert argv[:3] == ["python", "-m", "pipeline"], f"{name}: entrypoint {job['entrypoint']!r}"
    command = cli.commands.get(argv[3])
    assert command is not None, f"{name}: no command {argv[3]!r}"
    ctx = command.make_context(argv[3], argv[4:])  # click's own parse: exits on a bad option
    config = ROOT / ctx.params["config_path"]
    assert config.is_file(), f"{name}: {config} does not exist"
    loader_module, loader = LOADERS[argv[3]]
    getattr(importlib.import_module(loader_module), loader)(config)


def test_cron_fallback_forbids_overlap_and_creates_the_refresh_rayjob():
    docs = {doc["kind"]: doc for name, doc in manifests() if name == "cronjob-refresh-gb300.yaml"}
    cron = docs["CronJob"]["spec"]
    assert cron["concurrencyPolicy"] == "Forbid"
    pod = cron["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    (rule,) = docs["Role"]["rules"]
    assert rule["apiGroups"] == ["ray.io"] and "create" in rule["verbs"]
    assert docs["RoleBinding"]["roleRef"]["name"] == docs["Role"]["metadata"]["name"]
    script = pod["containers"][0]["args"][0]
    (created,) = re.findall(r"kubectl create -f (\S+)", script)
    mount = pod["containers"][0]["volumeMounts"][0]
    assert created.startswith(mount["mountPath"] + "/")
    rayjob = CLUSTER / Path(created).name
    (doc,) = yaml.safe_load_all(rayjob.read_text())
    assert doc["kind"] == "RayJob" and "generateName" in doc["metadata"]  # one per schedule
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    header = (CLUSTER / "cronjob-refresh-gb300.yaml").read_text()
    configmap = volume["configMap"]["name"]
    assert f"create configmap {configmap} --from-file=cluster/{rayjob.name}" in header


def test_cluster_launcher_yaml_passes_rays_own_checks(tmp_path):
    from ray._private.label_utils import parse_node_labels_from_yaml_file
    from ray.autoscaler._private.providers import _get_node_provider_cls
    from ray.autoscaler._private.util import prepare_config, validate_config

    from pipeline.regenerate.config import load_config

    raw = yaml.safe_load(LAUNCHER.read_text())
    config = prepare_config(copy.deepcopy(raw))  # what `ray up` does first
    validate_config(config)
    config = _get_node_provider_cls(config["provider"]).bootstrap_config(config)
    placement = load_config(RACK_CONFIG).replicas.placement
    trays = placement.num_bundles // 4 * len(placement.domains)
    assert len(raw["provider"]["worker_ips"]) == trays == 72
    assert config["available_node_types"]["local.cluster.node"]["min_workers"] == trays
    (start,) = [c for c in raw["worker_start_ray_commands"] if "ray start" in c]
    (labels_file,) = re.findall(r"--labels-file=(\S+)", start)
    # The one-line file provisioning writes on a tray, as Ray parses it.
    example = tmp_path / Path(labels_file).name
    example.write_text(f"{placement.domain_label}: {placement.domains[0]}\n")
    assert parse_node_labels_from_yaml_file(str(example)) == {
        placement.domain_label: placement.domains[0]
    }
