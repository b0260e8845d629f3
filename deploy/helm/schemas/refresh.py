"""Regenerate the JSON schemas kubeconform validates the chart's manifests against.

    .venv/bin/python deploy/helm/schemas/refresh.py [--kubernetes v1.30.14] \
        [--prometheus-operator v0.85.0]

The tests must never fetch a schema, so the few the chart needs are vendored next to this
file, made from sources the Go module proxy serves (the same place helm and kubeconform
come from, so no other network access is needed):

- ``kubernetes/``: the OpenAPI v2 document ``api/openapi-spec/swagger.json`` of the Go
  module ``k8s.io/kubernetes`` at the oldest Kubernetes release the chart supports
  (docs/deploy.md). Validating against the oldest release catches a field
  the chart uses that older clusters would reject. ``_definitions.json`` holds only the
  definitions the vendored kinds reach; each kind's file refers to it.
- ``monitoring.coreos.com/``: the ``openAPIV3Schema`` of the ServiceMonitor and
  PrometheusRule CRDs shipped in ``example/prometheus-operator-crd`` of the Go module
  ``github.com/prometheus-operator/prometheus-operator``.

The conversion follows what kubeconform's own schemas (yannh/kubernetes-json-schema,
"strict") do, so ``kubeconform -strict`` behaves as it does with those: every object
with listed properties gets ``additionalProperties: false`` (a misspelt field is an
error), optional values may be null (the API server treats null as unset),
int-or-string fields take either, quantities take a string or a number. Descriptions
are dropped: they are most of the size and kubeconform never shows them.

``SOURCES.json`` records the module versions and the SHA-256 of their zips (the
checksum database vouches for those), so a refresh is reproducible and reviewable.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent

KUBERNETES_MODULE = "k8s.io/kubernetes"
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"

# (group, version, kind) the chart renders; "" is the core group.
KUBERNETES_KINDS = [
    ("apps", "v1", "Deployment"),
    ("", "v1", "Service"),
    ("", "v1", "ConfigMap"),
    ("", "v1", "Secret"),
    ("", "v1", "PersistentVolumeClaim"),
    ("", "v1", "ServiceAccount"),
    ("policy", "v1", "PodDisruptionBudget"),
    ("networking.k8s.io", "v1", "NetworkPolicy"),
    ("rbac.authorization.k8s.io", "v1", "Role"),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding"),
    # Not rendered as an object: the Spark executor pod template (a ConfigMap's data) is
    # validated as one.
    ("", "v1", "Pod"),
]
CRDS = {
    "monitoring.coreos.com_servicemonitors.yaml": "v1",
    "monitoring.coreos.com_prometheusrules.yaml": "v1",
}

INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
# Keys whose value maps names to schemas (not a schema itself).
SCHEMA_MAPS = ("properties", "definitions", "patternProperties")


def module_dir(module: str, version: str) -> tuple[Path, str]:
    """Download ``module@version`` through the Go module proxy; its directory and the
    SHA-256 of its zip."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        check=True,
        capture_output=True,
        text=True,
    )
    info = json.loads(out.stdout)
    if "Error" in info:
        raise SystemExit(f"go mod download {module}@{version}: {info['Error']}")
    digest = hashlib.sha256(Path(info["Zip"]).read_bytes()).hexdigest()
    return Path(info["Dir"]), digest


def strict(node: Any, *, in_map: bool = False) -> Any:
    """The kubeconform-strict form of one schema node (module docstring)."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    if in_map:
        return {name: strict(schema) for name, schema in node.items()}
    if node.get("x-kubernetes-int-or-string") or node.get("format") == "int-or-string":
        return {"oneOf": [{"type": ["string", "null"]}, {"type": ["integer", "null"]}]}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "description" or key.startswith("x-kubernetes-"):
            continue
        out[key] = strict(value, in_map=key in SCHEMA_MAPS)
    kind = out.get("type")
    if isinstance(kind, str):
        out["type"] = [kind, "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref.removeprefix("#/definitions/")
        for value in node.values():
            yield from references(value)
    elif isinstance(node, list):
        for item in node:
            yield from references(item)


def reachable(definitions: dict[str, Any], roots: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(references(definitions[name]))
    return seen


def write(path: Path, schema: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")


def kind_document(kind: str, group: str, version: str, body: Any) -> dict[str, Any]:
    """A kind's schema: its definition, with kind and apiVersion pinned."""
    api_version = f"{group}/{version}" if group else version
    return {
        "allOf": [
            body,
            {
                "properties": {"apiVersion": {"enum": [api_version]}, "kind": {"enum": [kind]}},
                "required": ["apiVersion", "kind"],
            },
        ]
    }


def kubernetes(version: str) -> str:
    directory, digest = module_dir(KUBERNETES_MODULE, version)
    swagger = json.loads((directory / "api/openapi-spec/swagger.json").read_text())
    definitions: dict[str, Any] = swagger["definitions"]
    by_gvk = {
        (gvk["group"], gvk["version"], gvk["kind"]): name
        for name, schema in definitions.items()
        for gvk in schema.get("x-kubernetes-group-version-kind", [])
    }
    roots = {gvk: by_gvk[gvk] for gvk in KUBERNETES_KINDS}
    out = HERE / "kubernetes"
    for old in out.glob("*.json"):
        old.unlink()
    kept = {name: strict(definitions[name]) for name in reachable(definitions, [*roots.values()])}
    kept[INT_OR_STRING] = strict({"format": "int-or-string"})
    kept[QUANTITY] = {"oneOf": [{"type": ["string", "null"]}, {"type": ["number", "null"]}]}
    write(out / "_definitions.json", {"definitions": kept})
    for (group, api_version, kind), name in roots.items():
        # kubeconform's {{ .KindSuffix }}: -<first part of the group>-<version>, or -<version>.
        suffix = f"-{group.split('.')[0]}-{api_version}" if group else f"-{api_version}"
        ref = {"$ref": f"_definitions.json#/definitions/{name}"}
        write(out / f"{kind.lower()}{suffix}.json", kind_document(kind, group, api_version, ref))
    return digest


def prometheus_operator(version: str) -> str:
    directory, digest = module_dir(PROMETHEUS_OPERATOR_MODULE, version)
    for file, served in CRDS.items():
        crd = yaml.safe_load((directory / "example/prometheus-operator-crd" / file).read_text())
        group = crd["spec"]["group"]
        kind = crd["spec"]["names"]["kind"]
        (schema,) = [
            v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == served
        ]
        # {{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json
        document = kind_document(kind, group, served, strict(schema))
        write(HERE / group / f"{kind.lower()}_{served}.json", document)
    return digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes", default="v1.30.14", help="k8s.io/kubernetes version")
    parser.add_argument(
        "--prometheus-operator", default="v0.85.0", help="prometheus-operator module version"
    )
    args = parser.parse_args()
    sources = {
        KUBERNETES_MODULE: {"version": args.kubernetes, "zip_sha256": kubernetes(args.kubernetes)},
        PROMETHEUS_OPERATOR_MODULE: {
            "version": args.prometheus_operator,
            "zip_sha256": prometheus_operator(args.prometheus_operator),
        },
    }
    (HERE / "SOURCES.json").write_text(json.dumps(sources, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
