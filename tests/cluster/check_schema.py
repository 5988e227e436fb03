"""Compare the Ray parts of k8s_schema.yaml with the CRDs of a KubeRay release.

    python tests/cluster/check_schema.py <kuberay checkout or its ray-operator/config/crd/bases>

For every Ray object level the compact schema describes, each field it lists
must exist in the CRD with the same JSON type, the CRD's fields must all be
listed (nothing silently missing), and the CRD's required fields must be
required here too. Prints the differences and exits 1 if there are any. A
maintenance tool for bumping the KubeRay version (the CRDs are not kept in
this repository); the tests use only the compact schema.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

SCHEMA = Path(__file__).with_name("k8s_schema.yaml")

# compact $def -> (CRD file stem, path of property names from the version's spec)
LEVELS = {
    "RayClusterSpec": ("rayclusters", ()),
    "HeadGroupSpec": ("rayclusters", ("headGroupSpec",)),
    "WorkerGroupSpec": ("rayclusters", ("workerGroupSpecs", "[]")),
    "RayJobSpec": ("rayjobs", ()),
    "RayCronJob.spec": ("raycronjobs", ()),
}
NESTED = {  # compact (def, property) whose inline object is a complete level too
    ("RayClusterSpec", "authOptions"): ("rayclusters", ("authOptions",)),
    ("RayClusterSpec", "upgradeStrategy"): ("rayclusters", ("upgradeStrategy",)),
    ("RayJobSpec", "submitterConfig"): ("rayjobs", ("submitterConfig",)),
    ("WorkerGroupSpec", "scaleStrategy"): (
        "rayclusters",
        ("workerGroupSpecs", "[]", "scaleStrategy"),
    ),
}


def crd_spec(bases: Path, stem: str) -> dict:
    doc = yaml.safe_load((bases / f"ray.io_{stem}.yaml").read_text())
    (version,) = [v for v in doc["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def walk(node: dict, path: tuple[str, ...]) -> dict:
    for key in path:
        node = node["items"] if key == "[]" else node["properties"][key]
    return node


def json_type(node: dict, defs: dict) -> str | None:
    while "$ref" in node:
        node = defs[node["$ref"].split("/")[-1]]
    if "enum" in node:
        return "string"
    if "const" in node:
        return "string"
    return node.get("type")


def compare(name: str, mine: dict, theirs: dict, defs: dict) -> list[str]:
    problems = []
    props, crd_props = mine.get("properties", {}), theirs.get("properties", {})
    for field in sorted(set(props) - set(crd_props)):
        problems.append(f"{name}.{field}: not in the CRD")
    for field in sorted(set(crd_props) - set(props)):
        problems.append(f"{name}.{field}: in the CRD, missing here")
    for field in sorted(set(props) & set(crd_props)):
        mine_t, crd_t = json_type(props[field], defs), crd_props[field].get("type")
        if crd_t and mine_t and mine_t != crd_t:
            problems.append(f"{name}.{field}: type {mine_t} here, {crd_t} in the CRD")
        enum = crd_props[field].get("enum")
        if enum and set(props[field].get("enum", enum)) != set(enum):
            problems.append(
                f"{name}.{field}: enum {props[field].get('enum')} here, {enum} in the CRD"
            )
    for field in theirs.get("required", []):
        if field not in mine.get("required", []):
            problems.append(f"{name}.{field}: required by the CRD, optional here")
    return problems


def main(root: str) -> int:
    bases = Path(root)
    if (bases / "ray-operator").is_dir():
        bases = bases / "ray-operator/config/crd/bases"
    defs = yaml.safe_load(SCHEMA.read_text())["$defs"]
    problems: list[str] = []
    for name, (stem, path) in LEVELS.items():
        mine = defs[name] if "." not in name else defs["RayCronJob"]["properties"]["spec"]
        problems += compare(name, mine, walk(crd_spec(bases, stem), path), defs)
    for (name, field), (stem, path) in NESTED.items():
        mine = defs[name]["properties"][field]
        problems += compare(f"{name}.{field}", mine, walk(crd_spec(bases, stem), path), defs)
    for line in problems:
        print(line)
    print(f"{len(problems)} difference(s) against {bases}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
