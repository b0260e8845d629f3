"""The Helm chart, rendered and validated offline with the real helm and kubeconform.

What is proven on the rendered manifests, for every values file in the chart's ``ci/``:

- ``helm lint --strict`` passes and ``kubeconform -strict`` finds every object valid
  against the schemas vendored in ``deploy/helm/schemas`` (never fetched);
- every pod meets Pod Security "restricted" and runs with a read-only root file system,
  with every directory the services write to on a writable volume;
- no ConfigMap holds a secret: the PostgreSQL password and the secret Kafka client
  properties reach the pods only as files mounted from the Secrets the values name;
- the probes ask the services' own health endpoints on the port they listen on;
- every setting of both services (walked from the settings models, so a setting added
  later is checked too) can be set through values and arrives, parsed by the services'
  own settings classes, as the value that was set.
- in apply.spark.mode=kubernetes the driver gets exactly the API rights Spark uses, the
  executors run the apply image from a pod template that meets the same profile and is
  a valid Pod, the driver's headless Service and NetworkPolicy carry the ports of its
  Spark conf; a lake on object storage mounts no volume and takes its credentials from
  a Secret or workload identity, and the schema refuses a lake executors cannot share.

helm and kubeconform come from ``make tools`` (``.local/bin``). Without them the tests
are skipped locally, naming the command; in CI (``CI=true``) a missing binary fails.
"""

from __future__ import annotations

import enum
import inspect
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
import pytest
import yaml
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource

from apply.settings import ApplySettings
from capture.publish.publisher import ChangePublisher
from capture.settings import CaptureSettings
from capture.snapshot.run import SnapshotRun
from runtime.settings_table import defaults, setting_rows

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "pgdelta-cdc"
SCHEMAS = ROOT / "deploy" / "helm" / "schemas"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
SCHEMA_LOCATIONS = [
    str(SCHEMAS / "kubernetes" / "{{ .ResourceKind }}{{ .KindSuffix }}.json"),
    str(SCHEMAS / "{{ .Group }}" / "{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json"),
]
SERVICES: dict[str, type[BaseSettings]] = {"capture": CaptureSettings, "apply": ApplySettings}


# --- the tools ---------------------------------------------------------------------------


def _tool(name: str) -> Path:
    local = ROOT / ".local" / "bin" / name
    found = local if local.is_file() else shutil.which(name)
    if found is None:
        reason = f"{name} is not installed: run `make tools` (builds it into .local/bin)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return Path(found)


@pytest.fixture(scope="module")
def helm() -> Path:
    return _tool("helm")


@pytest.fixture(scope="module")
def kubeconform() -> Path:
    return _tool("kubeconform")


def _run(argv: list[str | Path], stdin: str = "") -> subprocess.CompletedProcess[str]:
    # HOME and XDG dirs in a temporary place: helm must not read or write a user's config.
    return subprocess.run(
        [str(arg) for arg in argv],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _template(helm: Path, values: list[Path], extra: list[str] | None = None) -> str:
    argv: list[str | Path] = [helm, "template", "cdc", CHART, "--namespace", "data"]
    for path in values:
        argv += ["--values", path]
    result = _run([*argv, *(extra or [])])
    assert result.returncode == 0, result.stderr
    return result.stdout


def _render(helm: Path, values: list[Path], extra: list[str] | None = None) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(_template(helm, values, extra)) if doc]


def _render_error(helm: Path, extra: list[str]) -> str:
    result = _run([helm, "template", "cdc", CHART, *extra])
    assert result.returncode != 0, "rendering was expected to be refused"
    return result.stderr


def _values_file(tmp_path: Path, values: Mapping[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(json.dumps(values))  # JSON is YAML, and keeps the types as written
    return path


def _kinds(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _deployment(docs: list[dict[str, Any]], service: str) -> dict[str, Any]:
    (deployment,) = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == service
    ]
    return deployment


def _container_env(docs: list[dict[str, Any]], service: str) -> dict[str, str]:
    """The literal environment the service's container starts with: its ConfigMaps, then
    its own ``env`` values over them (Kubernetes' order)."""
    pod = _deployment(docs, service)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    config_maps = _kinds(docs, "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(config_maps[source["configMapRef"]["name"]]["data"])
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
    return env


# --- lint, render, kubeconform -----------------------------------------------------------


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_lint_strict(helm: Path, values: Path) -> None:
    result = _run([helm, "lint", "--strict", CHART, "--values", values])
    assert result.returncode == 0, result.stdout + result.stderr


def test_ci_values_cover_defaults_and_non_defaults() -> None:
    names = {p.stem for p in CI_VALUES}
    assert {"default-values", "production-values", "minimal-values"} <= names
    assert yaml.safe_load((CHART / "ci" / "default-values.yaml").read_text()) == {
        "postgres": {"tables": ["public.orders"]}
    }


def test_defaults_alone_name_the_one_missing_value(helm: Path) -> None:
    assert "set postgres.tables or postgres.schemas" in _render_error(helm, [])


def _kubeconform(kubeconform: Path, manifests: str) -> dict[str, Any]:
    argv: list[str | Path] = [kubeconform, "-strict", "-summary", "-output", "json"]
    for location in SCHEMA_LOCATIONS:
        argv += ["-schema-location", location]
    result = _run([*argv, "-"], stdin=manifests)
    report = json.loads(result.stdout)
    assert isinstance(report, dict)
    report["returncode"] = result.returncode
    return report


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_rendered_manifests_match_the_vendored_schemas(
    helm: Path, kubeconform: Path, values: Path
) -> None:
    manifests = _template(helm, [values])
    count = len([d for d in yaml.safe_load_all(manifests) if d])
    report = _kubeconform(kubeconform, manifests)
    assert report["resources"] == [], report["resources"]  # invalid, errored or skipped ones
    assert report["summary"]["valid"] == count
    assert report["returncode"] == 0


def test_kubeconform_rejects_a_misspelt_field(helm: Path, kubeconform: Path) -> None:
    """The vendored schemas are strict, so the test above can fail."""
    manifests = _template(helm, [CHART / "ci" / "production-values.yaml"])
    misspelt = manifests.replace("readOnlyRootFilesystem:", "readOnlyRootFileSystem:")
    report = _kubeconform(kubeconform, misspelt)
    assert {r["status"] for r in report["resources"]} == {"statusInvalid"}
    assert {r["kind"] for r in report["resources"]} == {"Deployment"}
    assert "readOnlyRootFileSystem" in report["resources"][0]["msg"]


def test_production_values_render_every_optional_kind(helm: Path) -> None:
    kinds = {d["kind"] for d in _render(helm, [CHART / "ci" / "production-values.yaml"])}
    assert kinds == {
        "Deployment",
        "ConfigMap",
        "Service",
        "ServiceAccount",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceMonitor",
        "PrometheusRule",
    }
    # Every kind rendered has a vendored schema (Secret and PVC included, for the others).
    assert kinds <= {d["kind"] for d in _vendored_kinds()}


def _vendored_kinds() -> Iterator[dict[str, str]]:
    for path in SCHEMAS.rglob("*.json"):
        if path.name.startswith("_") or path.name == "SOURCES.json":
            continue
        pinned = json.loads(path.read_text())["allOf"][1]["properties"]
        yield {"kind": pinned["kind"]["enum"][0], "apiVersion": pinned["apiVersion"]["enum"][0]}


def test_vendored_schemas_refer_only_to_local_files() -> None:
    def refs(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                yield node["$ref"]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for item in node:
                yield from refs(item)

    found = {ref for path in SCHEMAS.rglob("*.json") for ref in refs(json.loads(path.read_text()))}
    assert found
    assert [r for r in found if not r.startswith(("#/", "_definitions.json#/"))] == []
    assert "$schema" not in (SCHEMAS / "kubernetes" / "_definitions.json").read_text()


# --- pod security ------------------------------------------------------------------------

RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _pods(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] == "Deployment":
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


EXECUTOR_TEMPLATE = "executor-pod-template.yaml"


def _executor_pod(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Spark executor pod template of apply.spark.mode=kubernetes, or None."""
    for config_map in _kinds(docs, "ConfigMap").values():
        if EXECUTOR_TEMPLATE in config_map["data"]:
            pod: dict[str, Any] = yaml.safe_load(config_map["data"][EXECUTOR_TEMPLATE])
            return pod
    return None


def _restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Pod Security Standards, "restricted" profile (kubernetes.io/docs/concepts/security/
    pod-security-standards), plus a read-only root file system."""
    problems = []
    pod_context = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(f"{key} is set")
    for volume in pod.get("volumes", []):
        types = set(volume) - {"name"}
        if not types <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']} is {types}")
    for container in pod.get("initContainers", []) + pod["containers"]:
        name = container["name"]
        context = container.get("securityContext", {})
        if context.get("privileged"):
            problems.append(f"{name} is privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name} may escalate privileges")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            problems.append(f"{name} may run as root")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{name} runs as UID 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name} has no seccomp profile")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name} does not drop ALL capabilities")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name} adds capabilities {capabilities['add']}")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            problems.append(f"{name} uses a host port")
        if context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name} has a writable root file system")
    return problems


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_every_pod_meets_pod_security_restricted(helm: Path, values: Path) -> None:
    docs = _render(helm, [values])
    pods = dict(_pods(docs))
    assert len(pods) == 2
    executor = _executor_pod(docs)
    if executor is not None:  # the pods Spark makes from it must meet the profile too
        pods["executor template"] = executor["spec"]
    assert {name: _restricted_violations(pod) for name, pod in pods.items()} == {
        name: [] for name in pods
    }
    for name, pod in pods.items():
        # Only a Spark driver with executor pods calls the API, so only it has a token.
        drives_executors = executor is not None and name.endswith("-apply")
        assert pod["automountServiceAccountToken"] is drives_executors, name
        if name != "executor template":
            # A service link's CAPTURE_*/APPLY_* name would stop the service's start.
            assert pod["enableServiceLinks"] is False, name


@pytest.mark.parametrize(
    ("pod", "violation"),
    [
        ({"hostNetwork": True, "containers": []}, "hostNetwork is set"),
        ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}], "containers": []}, "volume h"),
        ({"containers": [{"name": "c"}]}, "c may escalate privileges"),
        ({"containers": [{"name": "c"}]}, "c has no seccomp profile"),
        (
            {
                "containers": [
                    {"name": "c", "securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}
                ]
            },
            "c does not drop ALL capabilities",
        ),
    ],
)
def test_restricted_check_finds_violations(pod: dict[str, Any], violation: str) -> None:
    assert any(violation in problem for problem in _restricted_violations(pod))


def _writable_mounts(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """mount path -> volume type, for the container's writable mounts."""
    volumes = {v["name"]: next(iter(set(v) - {"name"})) for v in pod["volumes"]}
    return {
        m["mountPath"]: volumes[m["name"]]
        for m in container["volumeMounts"]
        if not m.get("readOnly")
    }


def _on_mount(path: str, mounts: Mapping[str, str]) -> str | None:
    for mount, kind in mounts.items():
        if PurePosixPath(path).is_relative_to(mount):
            return kind
    return None


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_what_the_services_write_is_on_a_writable_volume(helm: Path, values: Path) -> None:
    docs = _render(helm, [values])
    for service in SERVICES:
        pod = _deployment(docs, service)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        mounts = _writable_mounts(pod, container)
        env = _container_env(docs, service)
        assert mounts.get("/tmp") == "emptyDir", service
        if service == "capture":
            assert _on_mount(env["CAPTURE_SPOOL_DIR"], mounts) == "emptyDir"
        else:
            conf = json.loads(env["APPLY_SPARK__CONF"])
            assert _on_mount(conf["spark.local.dir"], mounts) == "emptyDir"
            assert _on_mount("/home/cdc/.ivy2", mounts) == "emptyDir"  # the image's home
            for path in (env["APPLY_LAKE__ROOT"], env["APPLY_LAKE__CHECKPOINT_ROOT"]):
                if re.match("(s3a|abfss|gs)://", path):  # object storage: no volume at all
                    assert "lake" not in {v["name"] for v in pod["volumes"]}
                    continue
                assert _on_mount(path, mounts) in {"persistentVolumeClaim", "emptyDir"}


# --- secrets -----------------------------------------------------------------------------


def _secret_volume(pod: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The Secret volume source ``path`` (a file or directory) is mounted from."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        mounted = PurePosixPath(mount["mountPath"])
        if PurePosixPath(path) == mounted or PurePosixPath(path).parent == mounted:
            volume = volumes[mount["name"]]
            assert "secret" in volume, f"{path} is on {volume}, not a Secret"
            assert mount.get("readOnly") is True
            source: dict[str, Any] = volume["secret"]
            return source
    raise AssertionError(f"nothing is mounted at {path}")


def test_secrets_are_mounted_from_the_secrets_the_values_name(helm: Path) -> None:
    docs = _render(helm, [CHART / "ci" / "production-values.yaml"])
    values = yaml.safe_load((CHART / "ci" / "production-values.yaml").read_text())
    for service in SERVICES:
        pod = _deployment(docs, service)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = _container_env(docs, service)
        prefix = service.upper()
        secrets_dir = env[f"{prefix}_KAFKA__CLIENT_SECRETS_DIR"]
        kafka_secret = _secret_volume(pod, container, secrets_dir)
        assert kafka_secret["secretName"] == values[service]["kafkaClientSecret"]
        assert "items" not in kafka_secret, "every key of the Secret is a property"
        registry_file = env[f"{prefix}_KAFKA__REGISTRY__PASSWORD_FILE"]
        registry_secret = _secret_volume(pod, container, registry_file)
        assert registry_secret["secretName"] == values["kafka"]["registry"]["existingSecret"]
        assert registry_secret["items"] == [
            {"key": values["kafka"]["registry"]["passwordKey"], "path": "password"}
        ]
    capture_pod = _deployment(docs, "capture")["spec"]["template"]["spec"]
    password_file = _container_env(docs, "capture")["CAPTURE_POSTGRES__PASSWORD_FILE"]
    source = _secret_volume(capture_pod, capture_pod["containers"][0], password_file)
    assert source["secretName"] == values["postgres"]["existingSecret"]
    assert source["items"] == [
        {"key": values["postgres"]["passwordKey"], "path": PurePosixPath(password_file).name}
    ]


def test_shared_kafka_secret_reaches_both_services(helm: Path) -> None:
    docs = _render(
        helm,
        [CHART / "ci" / "default-values.yaml"],
        ["--set", "kafka.clientSecret=shared", "--set", "apply.kafkaClientSecret=own"],
    )
    names = {}
    for service in SERVICES:
        pod = _deployment(docs, service)["spec"]["template"]["spec"]
        directory = _container_env(docs, service)[f"{service.upper()}_KAFKA__CLIENT_SECRETS_DIR"]
        names[service] = _secret_volume(pod, pod["containers"][0], directory)["secretName"]
    assert names == {"capture": "shared", "apply": "own"}


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.stem)
def test_no_configmap_holds_a_secret(helm: Path, values: Path) -> None:
    for config_map in _kinds(_render(helm, [values]), "ConfigMap").values():
        for name, value in config_map["data"].items():
            if name.endswith(("PASSWORD_FILE", "_SECRETS_DIR")):
                assert value.startswith("/var/run/secrets/"), (name, "where a Secret is mounted")
                continue
            assert "PASSWORD" not in name, name
            assert "SECRET" not in name, name
            if value.startswith("{"):  # client properties, Spark confs
                secret = [k for k in json.loads(value) if re.search("password|secret|jaas", k)]
                assert secret == [], name
    assert "Secret" not in {d["kind"] for d in _render(helm, [values])}


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--set", "kafka.client.sasl\\.password=x"], 'property "sasl.password" is a secret'),
        (["--set", "capture.kafkaClient.sasl\\.jaas\\.config=x"], "put it in the Secret"),
        (["--set", "apply.kafkaClient.ssl\\.key\\.password=x"], "kafka.clientSecret"),
        (["--set", "capture.settings.CAPTURE_POSTGRES__PASSWORD=x"], "would put a secret"),
        (
            ["--set", "apply.kafkaSparkSource.sasl\\.jaas\\.config=x"],
            "not in apply.kafkaSparkSource",
        ),
        (
            ["--set", "apply.settings.APPLY_KAFKA__SPARK_SOURCE.ssl\\.keystore\\.password=x"],
            "not in apply.settings.APPLY_KAFKA__SPARK_SOURCE",
        ),
        (["--set", "postgres.dsn=postgresql://cdc:hunter2@db/app"], "dsn holds a password"),
        (["--set", "postgres.dsn=host=db password=hunter2"], "dsn holds a password"),
        (["--set", "kafka.registry.url=https://u:pw@registry"], "kafka/registry/url"),
    ],
)
def test_a_secret_in_values_is_refused(helm: Path, flags: list[str], complaint: str) -> None:
    base = ["--values", str(CHART / "ci" / "default-values.yaml")]
    assert complaint in _render_error(helm, base + flags)


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--set", "capture.settings.CAPTURE_METRICS__PORT=1"], "set capture.metrics.port"),
        (["--set", "apply.settings.APPLY_KAFKA__TOPIC_PREFIX=x"], "set kafka.topicPrefix"),
        (["--set", "apply.settings.CAPTURE_TOMBSTONES=true"], "does not match pattern '^APPLY_"),
        (["--set", "capture.snapshotMode=sometimes"], "capture/snapshotMode"),
        (["--set", "kafka.encoding=registry"], "needs kafka.registry.url"),
        (
            ["--set", "capture.settings.CAPTURE_KAFKA__REGISTRY__SUBJECT_STRATEGY=record"],
            "set kafka.registry.subjectStrategy",
        ),
        (["--set", "capture.settigns.X=1"], "'settigns' not allowed"),
    ],
)
def test_values_that_cannot_work_are_refused(helm: Path, flags: list[str], complaint: str) -> None:
    base = ["--values", str(CHART / "ci" / "default-values.yaml")]
    assert complaint in _render_error(helm, base + flags)


# --- probes, grace, metrics --------------------------------------------------------------


@pytest.mark.parametrize("values", ["default-values", "production-values"])
def test_probes_ask_the_health_endpoints_on_the_metrics_port(helm: Path, values: str) -> None:
    docs = _render(helm, [CHART / "ci" / f"{values}.yaml"])
    for service in SERVICES:
        env = _container_env(docs, service)
        prefix = service.upper()
        (container,) = _deployment(docs, service)["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert env[f"{prefix}_METRICS__ENABLED"] == "true"
        assert env[f"{prefix}_METRICS__HOST"] == "0.0.0.0"
        assert str(ports["metrics"]) == env[f"{prefix}_METRICS__PORT"]
        paths = {
            probe: container[probe]["httpGet"]["path"]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe")
        }
        assert paths == {
            "startupProbe": "/healthz",
            "livenessProbe": "/healthz",
            "readinessProbe": "/readyz",
        }
        for probe in paths:
            assert container[probe]["httpGet"]["port"] == "metrics"
        (service_doc,) = [
            d
            for d in _kinds(docs, "Service").values()
            if d["metadata"]["labels"]["app.kubernetes.io/component"] == service
        ]
        assert service_doc["spec"]["ports"][0]["targetPort"] == "metrics"
        pod_labels = _deployment(docs, service)["spec"]["template"]["metadata"]["labels"]
        assert service_doc["spec"]["selector"].items() <= pod_labels.items()


def test_without_a_metrics_port_there_are_no_probes_nor_services(helm: Path) -> None:
    docs = _render(helm, [CHART / "ci" / "minimal-values.yaml"])
    for service in SERVICES:
        (container,) = _deployment(docs, service)["spec"]["template"]["spec"]["containers"]
        assert not {"startupProbe", "livenessProbe", "readinessProbe", "ports"} & set(container)
        assert _container_env(docs, service)[f"{service.upper()}_METRICS__ENABLED"] == "false"
    assert _kinds(docs, "Service") == {}


def test_capture_grace_period_outlasts_its_stop() -> None:
    """capture's stop (capture/stream/loop.py) cancels a running snapshot, flushes the producer,
    writes the checkpoint and flushes again; each wait has its own bound in the code."""

    def default(function: Any, parameter: str) -> float:
        value = inspect.signature(function).parameters[parameter].default
        assert isinstance(value, int | float)
        return float(value)

    stop = default(SnapshotRun.cancel, "timeout_s") + 2 * default(
        ChangePublisher.flush, "timeout_s"
    )
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["capture"]["terminationGracePeriodSeconds"] > stop


def test_grace_periods_reach_the_pods(helm: Path) -> None:
    docs = _render(helm, [CHART / "ci" / "default-values.yaml"])
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for service in SERVICES:
        pod = _deployment(docs, service)["spec"]["template"]["spec"]
        expected = values[service]["terminationGracePeriodSeconds"]
        assert pod["terminationGracePeriodSeconds"] == expected


def test_monitoring_objects_select_what_the_chart_renders(helm: Path) -> None:
    docs = _render(helm, [CHART / "ci" / "production-values.yaml"])
    services = _kinds(docs, "Service")
    (monitor,) = _kinds(docs, "ServiceMonitor").values()
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [s for s in services.values() if selector.items() <= s["metadata"]["labels"].items()]
    assert len(selected) == 2
    for service in selected:
        assert monitor["spec"]["endpoints"][0]["port"] in {
            p["name"] for p in service["spec"]["ports"]
        }
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (rule,) = _kinds(docs, "PrometheusRule").values()
    shipped = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())["spec"]["groups"]
    own = yaml.safe_load((CHART / "ci" / "production-values.yaml").read_text())["monitoring"]
    assert rule["spec"]["groups"] == shipped + own["prometheusRule"]["groups"]
    pods = {s: _deployment(docs, s)["spec"]["template"]["metadata"]["labels"] for s in SERVICES}
    for budget in _kinds(docs, "PodDisruptionBudget").values():
        matched = [
            s
            for s, labels in pods.items()
            if budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(matched) == 1
    (policy,) = _kinds(docs, "NetworkPolicy").values()
    assert all(
        policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        for labels in pods.values()
    )
    scraped = {p["port"] for p in policy["spec"]["ingress"][0]["ports"]}
    assert scraped == {int(_container_env(docs, s)[f"{s.upper()}_METRICS__PORT"]) for s in SERVICES}


def test_the_chart_ships_the_projects_alerts() -> None:
    """Helm reads only files inside the chart, so it carries a copy."""
    shipped = (CHART / "files" / "alerts.yaml").read_text()
    assert shipped == (ROOT / "deploy" / "prometheus" / "alerts.yaml").read_text(), (
        "cp deploy/prometheus/alerts.yaml deploy/helm/pgdelta-cdc/files/alerts.yaml"
    )


def test_a_prometheus_rule_without_rules_is_refused(helm: Path) -> None:
    flags = ["--values", str(CHART / "ci" / "default-values.yaml")]
    flags += ["--set", "monitoring.prometheusRule.enabled=true"]
    flags += ["--set", "monitoring.prometheusRule.defaultRules=false"]
    assert "there is no rule to ship" in _render_error(helm, flags)


def test_a_changed_setting_restarts_the_pod(helm: Path) -> None:
    base = [CHART / "ci" / "default-values.yaml"]

    def checksums(extra: list[str]) -> dict[str, str]:
        docs = _render(helm, base, extra)
        return {
            s: _deployment(docs, s)["spec"]["template"]["metadata"]["annotations"][
                "checksum/config"
            ]
            for s in SERVICES
        }

    before = checksums([])
    after = checksums(["--set", "apply.tableParallelism=2"])
    assert before["capture"] == after["capture"]
    assert before["apply"] != after["apply"]


# --- every setting settable --------------------------------------------------------------

# Settings with a typed value: variable -> path in values.yaml. The rest are set through
# <service>.settings (the generic map), except the ones below.
TYPED: dict[str, tuple[str, ...]] = {
    "CAPTURE_POSTGRES__DSN": ("postgres", "dsn"),
    "CAPTURE_POSTGRES__SLOT": ("postgres", "slot"),
    "CAPTURE_POSTGRES__PUBLICATION": ("postgres", "publication"),
    "CAPTURE_POSTGRES__TABLES": ("postgres", "tables"),
    "CAPTURE_POSTGRES__SCHEMAS": ("postgres", "schemas"),
    "CAPTURE_KAFKA__BOOTSTRAP_SERVERS": ("kafka", "bootstrapServers"),
    "CAPTURE_KAFKA__TOPIC_PREFIX": ("kafka", "topicPrefix"),
    "CAPTURE_KAFKA__CONTROL_TOPIC": ("kafka", "controlTopic"),
    "CAPTURE_KAFKA__SCHEMA_TOPIC": ("kafka", "schemaTopic"),
    "CAPTURE_KAFKA__PARTITIONS": ("kafka", "partitions"),
    "CAPTURE_KAFKA__REPLICATION_FACTOR": ("kafka", "replicationFactor"),
    "CAPTURE_KAFKA__CLIENT": ("capture", "kafkaClient"),
    "CAPTURE_KAFKA__PRODUCER": ("kafka", "producer"),
    "CAPTURE_KAFKA__ENCODING": ("kafka", "encoding"),
    "CAPTURE_KAFKA__REGISTRY__URL": ("kafka", "registry", "url"),
    "CAPTURE_KAFKA__REGISTRY__USERNAME": ("kafka", "registry", "username"),
    "CAPTURE_KAFKA__REGISTRY__CA_FILE": ("kafka", "registry", "caFile"),
    "CAPTURE_KAFKA__REGISTRY__SUBJECT_STRATEGY": ("kafka", "registry", "subjectStrategy"),
    "CAPTURE_KAFKA__REGISTRY__TIMEOUT_S": ("kafka", "registry", "timeoutS"),
    "CAPTURE_SNAPSHOT_MODE": ("capture", "snapshotMode"),
    "CAPTURE_TABLE_REFRESH_S": ("capture", "tableRefreshS"),
    "CAPTURE_TOMBSTONES": ("capture", "tombstones"),
    "CAPTURE_STATUS_INTERVAL_S": ("capture", "statusIntervalS"),
    "CAPTURE_MAX_IN_FLIGHT_RECORDS": ("capture", "maxInFlightRecords"),
    "CAPTURE_MAX_IN_FLIGHT_BYTES": ("capture", "maxInFlightBytes"),
    "CAPTURE_WAL__WARN_RETAINED_BYTES": ("capture", "wal", "warnRetainedBytes"),
    "CAPTURE_WAL__CHECK_INTERVAL_S": ("capture", "wal", "checkIntervalS"),
    "CAPTURE_METRICS__ENABLED": ("capture", "metrics", "enabled"),
    "CAPTURE_METRICS__PORT": ("capture", "metrics", "port"),
    "CAPTURE_METRICS__NOT_READY_AFTER_S": ("capture", "metrics", "notReadyAfterS"),
    "CAPTURE_LOG__FORMAT": ("capture", "log", "format"),
    "CAPTURE_LOG__LEVEL": ("capture", "log", "level"),
    "CAPTURE_LOG__PROGRESS_INTERVAL_S": ("capture", "log", "progressIntervalS"),
    "APPLY_KAFKA__MAX_OFFSETS_PER_TRIGGER": ("apply", "maxOffsetsPerTrigger"),
    "APPLY_KAFKA__CLIENT": ("apply", "kafkaClient"),
    "APPLY_KAFKA__SPARK_SOURCE": ("apply", "kafkaSparkSource"),
    "APPLY_LAKE__ROOT": ("lake", "root"),
    "APPLY_LAKE__CHECKPOINT_ROOT": ("lake", "checkpointRoot"),
    "APPLY_TRIGGER__MODE": ("apply", "trigger", "mode"),
    "APPLY_TRIGGER__INTERVAL": ("apply", "trigger", "interval"),
    "APPLY_SPARK__MASTER": ("apply", "spark", "master"),
    "APPLY_SPARK__JARS": ("apply", "spark", "jars"),
    "APPLY_SPARK__JARS_DIR": ("apply", "spark", "jarsDir"),
    "APPLY_SPARK__CONF": ("apply", "spark", "conf"),
    "APPLY_TABLE_PARALLELISM": ("apply", "tableParallelism"),
    "APPLY_LANES": ("apply", "lanes"),
    "APPLY_METRICS__ENABLED": ("apply", "metrics", "enabled"),
    "APPLY_METRICS__PORT": ("apply", "metrics", "port"),
    "APPLY_METRICS__NOT_READY_AFTER_S": ("apply", "metrics", "notReadyAfterS"),
    "APPLY_LOG__FORMAT": ("apply", "log", "format"),
    "APPLY_LOG__LEVEL": ("apply", "log", "level"),
    "APPLY_LOG__PROGRESS_INTERVAL_S": ("apply", "log", "progressIntervalS"),
}
# Shared Kafka names: one value feeds both services (capture's entry above sets it).
SHARED = {
    "APPLY_KAFKA__BOOTSTRAP_SERVERS": "CAPTURE_KAFKA__BOOTSTRAP_SERVERS",
    "APPLY_KAFKA__TOPIC_PREFIX": "CAPTURE_KAFKA__TOPIC_PREFIX",
    "APPLY_KAFKA__CONTROL_TOPIC": "CAPTURE_KAFKA__CONTROL_TOPIC",
    "APPLY_KAFKA__SCHEMA_TOPIC": "CAPTURE_KAFKA__SCHEMA_TOPIC",
    "APPLY_KAFKA__REGISTRY__URL": "CAPTURE_KAFKA__REGISTRY__URL",
    "APPLY_KAFKA__REGISTRY__USERNAME": "CAPTURE_KAFKA__REGISTRY__USERNAME",
    "APPLY_KAFKA__REGISTRY__CA_FILE": "CAPTURE_KAFKA__REGISTRY__CA_FILE",
    "APPLY_KAFKA__REGISTRY__SUBJECT_STRATEGY": "CAPTURE_KAFKA__REGISTRY__SUBJECT_STRATEGY",
    "APPLY_KAFKA__REGISTRY__TIMEOUT_S": "CAPTURE_KAFKA__REGISTRY__TIMEOUT_S",
}
# Wired by the chart from a value that is not the setting itself: variable -> (value path,
# value set there, the setting it must produce).
WIRED: dict[str, tuple[tuple[str, ...], Any, Any]] = {
    # Always all interfaces, so the probes and Prometheus reach the port.
    "CAPTURE_METRICS__HOST": ((), None, "0.0.0.0"),
    "APPLY_METRICS__HOST": ((), None, "0.0.0.0"),
    "CAPTURE_POSTGRES__PASSWORD_FILE": (
        ("postgres", "existingSecret"),
        "db-secret",
        Path("/var/run/secrets/pgdelta-cdc/postgres/password"),
    ),
    "CAPTURE_KAFKA__CLIENT_SECRETS_DIR": (
        ("kafka", "clientSecret"),
        "kafka-secret",
        Path("/var/run/secrets/pgdelta-cdc/kafka"),
    ),
    "APPLY_KAFKA__CLIENT_SECRETS_DIR": (
        ("kafka", "clientSecret"),
        "kafka-secret",
        Path("/var/run/secrets/pgdelta-cdc/kafka"),
    ),
    "CAPTURE_KAFKA__REGISTRY__PASSWORD_FILE": (
        ("kafka", "registry", "existingSecret"),
        "registry-secret",
        Path("/var/run/secrets/pgdelta-cdc/registry/password"),
    ),
    "APPLY_KAFKA__REGISTRY__PASSWORD_FILE": (
        ("kafka", "registry", "existingSecret"),
        "registry-secret",
        Path("/var/run/secrets/pgdelta-cdc/registry/password"),
    ),
}
# Secrets never pass through values: each is set through its file variant above.
SECRET_VIA_FILE = {
    "CAPTURE_POSTGRES__PASSWORD": "CAPTURE_POSTGRES__PASSWORD_FILE",
    "CAPTURE_KAFKA__REGISTRY__PASSWORD": "CAPTURE_KAFKA__REGISTRY__PASSWORD_FILE",
    "APPLY_KAFKA__REGISTRY__PASSWORD": "APPLY_KAFKA__REGISTRY__PASSWORD_FILE",
}


def _settings_fields(settings: type[BaseSettings]) -> dict[str, tuple[tuple[str, ...], FieldInfo]]:
    """Every variable of ``settings`` (as docs/configuration.md names them) -> the field
    path and the field."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    fields = {}
    for variable, _default, _doc in setting_rows(defaults(settings), prefix):
        path = tuple(part.lower() for part in variable.removeprefix(prefix).split("__"))
        model: type[BaseModel] = settings
        for part in path[:-1]:
            annotation = model.model_fields[part].annotation
            assert isinstance(annotation, type)
            assert issubclass(annotation, BaseModel)
            model = annotation
        fields[variable] = (path, model.model_fields[path[-1]])
    return fields


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def _bound(field: FieldInfo, kind: type[Any], attribute: str) -> float | None:
    for constraint in field.metadata:
        if isinstance(constraint, kind):
            return float(getattr(constraint, attribute))
    return None


# Samples where the chart checks the form of a value (values.schema.json).
SAMPLES: dict[str, Any] = {
    "CAPTURE_KAFKA__REGISTRY__URL": "https://registry.example/apis/ccompat/v7",
    # A volume path or an object-store URI, both of one kind; the URI form is the one
    # that changes the most around it (no volume, S3A settings in APPLY_SPARK__CONF).
    "APPLY_LAKE__ROOT": "s3a://sample-bucket/cdc/tables",
    "APPLY_LAKE__CHECKPOINT_ROOT": "s3a://sample-bucket/cdc/checkpoints",
    "APPLY_LANES": {"events": ["public.events"], "audit": ["audit.*"]},
}


def _sample(variable: str, field: FieldInfo) -> Any:
    """A value for ``field`` that differs from its default and meets its constraints."""
    if variable in SAMPLES:
        return SAMPLES[variable]
    annotation = _without_none(field.annotation)
    default = field.get_default(call_default_factory=True)
    origin = get_origin(annotation)
    if origin is Literal:
        return next(choice for choice in get_args(annotation) if choice != default)
    if annotation is bool:
        return not default
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return next(member for member in annotation if member != default)
    if annotation in (int, float):
        low = _bound(field, annotated_types.Ge, "ge") or _bound(field, annotated_types.Gt, "gt")
        high = _bound(field, annotated_types.Le, "le")
        base = default if isinstance(default, int | float) else (low or 0)
        value = base + (1 if annotation is int else 1.5)
        if high is not None and value > high:
            value = base - 1
        return int(value) if annotation is int else value
    if annotation is str:
        return f"sample-{variable.lower()}"
    if annotation is Path:
        return Path(f"/sample/{variable.lower()}")
    if origin is list:
        return ["sample.one", "sample.two"]
    if origin is dict:
        return {"sample.property": "value"}
    raise AssertionError(
        f"{variable}: no sample for {field.annotation}; teach _sample this type, and check "
        "the chart can pass it (pgdelta-cdc.envValue)"
    )


def _set(values: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        values = values.setdefault(part, {})
    values[path[-1]] = value


def _in_values(value: Any) -> Any:
    """How a sample is written in values: as YAML would hold it."""
    if isinstance(value, enum.Enum):
        return value.value
    return str(value) if isinstance(value, Path) else value


class _GivenEnv(EnvSettingsSource):
    """pydantic-settings' own environment source, over a given mapping."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._given = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {name.lower(): value for name, value in self._given.items()}


def _parsed(settings: type[BaseSettings], env: Mapping[str, str]) -> BaseSettings:
    """``settings`` as the service builds it from ``env`` and nothing else."""

    class FromEnv(settings):  # type: ignore[valid-type,misc]
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (_GivenEnv(settings_cls, env),)

    built: BaseSettings = FromEnv()
    return built


def _field_value(settings: BaseModel, path: tuple[str, ...]) -> Any:
    value: Any = settings
    for part in path:
        value = getattr(value, part)
    return value


def _plan() -> tuple[dict[str, Any], dict[str, tuple[str, tuple[str, ...], Any]]]:
    """Values setting every setting of both services, and what each must parse to:
    variable -> (service, field path, expected value)."""
    values: dict[str, Any] = {}
    expected: dict[str, tuple[str, tuple[str, ...], Any]] = {}
    for service, settings in SERVICES.items():
        for variable, (path, field) in _settings_fields(settings).items():
            if variable in SECRET_VIA_FILE:
                continue
            if field.annotation is SecretStr or _without_none(field.annotation) is SecretStr:
                raise AssertionError(
                    f"{variable} is a secret: give the chart a Secret reference for it "
                    "(a mounted file, as postgres.existingSecret) and list it in SECRET_VIA_FILE"
                )
            if variable in WIRED:
                value_path, value, result = WIRED[variable]
                if value_path:
                    _set(values, value_path, value)
                expected[variable] = (service, path, result)
                continue
            sample = _sample(variable, field)
            source = SHARED.get(variable, variable)
            if source in TYPED:
                if source == variable:
                    _set(values, TYPED[variable], _in_values(sample))
                    expected[variable] = (service, path, sample)
                continue
            _set(values, (service, "settings", variable), _in_values(sample))
            expected[variable] = (service, path, sample)
    for variable, source in SHARED.items():
        apply_path = _settings_fields(ApplySettings)[variable][0]
        expected[variable] = ("apply", apply_path, expected[source][2])
    return values, expected


def test_typed_values_name_real_settings() -> None:
    known = {v for settings in SERVICES.values() for v in _settings_fields(settings)}
    listed = (
        set(TYPED)
        | set(SAMPLES)
        | set(SHARED)
        | set(SHARED.values())
        | set(WIRED)
        | set(SECRET_VIA_FILE)
    )
    assert listed - known == set(), "stale entries: the settings were renamed or removed"


def test_every_setting_of_both_services_is_settable_through_values(
    helm: Path, kubeconform: Path, tmp_path: Path
) -> None:
    values, expected = _plan()
    every = {v for settings in SERVICES.values() for v in _settings_fields(settings)}
    assert set(expected) | set(SECRET_VIA_FILE) == every
    values_file = _values_file(tmp_path, values)
    manifests = _template(helm, [values_file])
    docs = [d for d in yaml.safe_load_all(manifests) if d]
    assert _kubeconform(kubeconform, manifests)["resources"] == []
    parsed = {s: _parsed(cls, _container_env(docs, s)) for s, cls in SERVICES.items()}
    wrong = {}
    for variable, (service, path, want) in sorted(expected.items()):
        got = _field_value(parsed[service], path)
        matches = got.items() >= want.items() if isinstance(want, dict) else got == want
        if not matches:
            wrong[variable] = (got, want)
    assert wrong == {}
    assert parsed["capture"].postgres.password is None  # type: ignore[attr-defined]


def test_generic_settings_win_over_typed_values(helm: Path, tmp_path: Path) -> None:
    values = {
        "postgres": {"tables": ["public.orders"]},
        "capture": {"statusIntervalS": 5, "settings": {"CAPTURE_STATUS_INTERVAL_S": 7.5}},
    }
    docs = _render(helm, [_values_file(tmp_path, values)])
    capture = _parsed(CaptureSettings, _container_env(docs, "capture"))
    assert capture.status_interval_s == 7.5  # type: ignore[attr-defined]


def test_numbers_keep_their_digits(helm: Path, tmp_path: Path) -> None:
    """YAML numbers reach templates as floats; 10 GiB must not arrive as 1.073741824e+10."""
    values = {
        "postgres": {"tables": ["public.orders"]},
        "capture": {"wal": {"warnRetainedBytes": 107374182400}},
        "apply": {"spark": {"conf": {"spark.sql.shuffle.partitions": 8}}},
    }
    docs = _render(helm, [_values_file(tmp_path, values)])
    assert _container_env(docs, "capture")["CAPTURE_WAL__WARN_RETAINED_BYTES"] == "107374182400"
    conf = json.loads(_container_env(docs, "apply")["APPLY_SPARK__CONF"])
    assert conf["spark.sql.shuffle.partitions"] == "8"


# --- Spark on Kubernetes and the object-store lake --------------------------------------

KUBERNETES_VALUES = CHART / "ci" / "kubernetes-values.yaml"
RWX_VALUES = CHART / "ci" / "kubernetes-rwx-values.yaml"
OBJECT_STORE_VALUES = CHART / "ci" / "objectstore-values.yaml"
OBJECT_STORE_ROOT = re.compile("^(s3a|abfss|gs)://")


def _spark_conf(docs: list[dict[str, Any]]) -> dict[str, str]:
    conf: dict[str, str] = json.loads(_container_env(docs, "apply")["APPLY_SPARK__CONF"])
    return conf


def _apply_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = _deployment(docs, "apply")["spec"]["template"]["spec"][
        "containers"
    ]
    (container,) = containers
    return container


def test_kubernetes_mode_grants_the_driver_exactly_what_spark_does_with_the_api(
    helm: Path,
) -> None:
    """Spark's client-mode driver (KubernetesClusterSchedulerBackend, ExecutorPodsAllocator)
    creates, gets (its own pod), lists, watches, patches (the executor-id label) and
    deletes (one by one and by label) executor pods; creates its executors' conf map and
    deletes it by label; at stop deletes its services and on-demand claims by label."""
    docs = _render(helm, [KUBERNETES_VALUES])
    (role,) = _kinds(docs, "Role").values()
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    lifecycle = {"create", "get", "list", "watch", "delete", "deletecollection"}
    assert granted == {
        ("", "pods"): lifecycle | {"patch"},
        ("", "configmaps"): lifecycle,
        ("", "services"): lifecycle,
        ("", "persistentvolumeclaims"): lifecycle,
    }
    assert [k for k in role if k not in {"apiVersion", "kind", "metadata", "rules"}] == []
    (binding,) = _kinds(docs, "RoleBinding").values()
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    driver_account = _deployment(docs, "apply")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": driver_account, "namespace": "data"}
    ]
    # capture keeps the shared account, which nothing binds to.
    capture_account = _deployment(docs, "capture")["spec"]["template"]["spec"]
    assert capture_account["serviceAccountName"] != driver_account
    assert driver_account in _kinds(docs, "ServiceAccount")
    assert not {"ClusterRole", "ClusterRoleBinding"} & {d["kind"] for d in docs}


def test_kubernetes_mode_without_rbac_binds_nothing(helm: Path) -> None:
    docs = _render(helm, [RWX_VALUES])
    assert not {"Role", "RoleBinding"} & {d["kind"] for d in docs}
    pod = _deployment(docs, "apply")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "cdc-spark"  # the existing account the values name
    assert "cdc-spark" not in _kinds(docs, "ServiceAccount")


def test_executors_run_the_apply_image_and_the_driver_is_their_owner(helm: Path) -> None:
    docs = _render(helm, [KUBERNETES_VALUES])
    conf = _spark_conf(docs)
    env = _container_env(docs, "apply")
    container = _apply_container(docs)
    assert env["APPLY_SPARK__MASTER"] == "k8s://https://kubernetes.default.svc"
    assert conf["spark.submit.deployMode"] == "client"
    assert conf["spark.kubernetes.namespace"] == "data"
    assert conf["spark.kubernetes.container.image"] == container["image"]
    assert conf["spark.kubernetes.container.image.pullPolicy"] == container["imagePullPolicy"]
    assert conf["spark.kubernetes.container.image.pullSecrets"] == "registry-credentials"
    executor = _executor_pod(docs)
    assert executor is not None
    (executor_container,) = executor["spec"]["containers"]
    assert executor_container["image"] == container["image"]
    assert executor_container["name"] == conf["spark.kubernetes.executor.podTemplateContainerName"]
    # The driver names its own pod through the downward API; Spark reads ${env:...}.
    variable = re.fullmatch(r"\$\{env:(\w+)\}", conf["spark.kubernetes.driver.pod.name"])
    assert variable is not None
    (pod_name,) = [e for e in container["env"] if e["name"] == variable.group(1)]
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Executor size as the values say.
    assert {k: conf[k] for k in conf if k.startswith("spark.executor.")} == {
        "spark.executor.instances": "4",
        "spark.executor.cores": "4",
        "spark.executor.memory": "8g",
        "spark.executor.memoryOverhead": "2g",
    }
    assert conf["spark.kubernetes.executor.request.cores"] == "3500m"
    assert conf["spark.kubernetes.executor.limit.cores"] == "4"
    # The settings the apply job builds from this environment.
    settings = _parsed(ApplySettings, env)
    assert settings.spark.master == env["APPLY_SPARK__MASTER"]  # type: ignore[attr-defined]
    assert settings.spark.conf == conf  # type: ignore[attr-defined]


def test_driver_reads_the_executor_template_it_names(helm: Path) -> None:
    docs = _render(helm, [KUBERNETES_VALUES])
    template_file = PurePosixPath(_spark_conf(docs)["spark.kubernetes.executor.podTemplateFile"])
    pod = _deployment(docs, "apply")["spec"]["template"]
    (mount,) = [
        m
        for m in _apply_container(docs)["volumeMounts"]
        if m["mountPath"] == str(template_file.parent)
    ]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    config_map = _kinds(docs, "ConfigMap")[volume["configMap"]["name"]]
    assert template_file.name in config_map["data"]
    # A changed template restarts the driver, as a changed setting does.
    assert "checksum/executor-template" in pod["metadata"]["annotations"]


def test_driver_service_ports_match_the_spark_conf(helm: Path) -> None:
    docs = _render(helm, [KUBERNETES_VALUES])
    conf = _spark_conf(docs)
    host = conf["spark.driver.host"]
    name, namespace, suffix = host.split(".")
    assert (namespace, suffix) == ("data", "svc")
    service = _kinds(docs, "Service")[name]
    assert service["spec"]["clusterIP"] == "None"  # headless: the name is the pod's address
    # Executors dial the driver before its query, and so its readiness, is up.
    assert service["spec"]["publishNotReadyAddresses"] is True
    labels = _deployment(docs, "apply")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["targetPort"]: p["port"] for p in service["spec"]["ports"]}
    container_ports = {p["name"]: p["containerPort"] for p in _apply_container(docs)["ports"]}
    assert {name: container_ports[name] for name in ports} == ports
    assert sorted(ports.values()) == sorted(
        {int(conf["spark.driver.port"]), int(conf["spark.blockManager.port"])}
    )
    assert conf["spark.driver.blockManager.port"] == conf["spark.blockManager.port"]
    assert (int(conf["spark.driver.port"]), int(conf["spark.blockManager.port"])) == (7100, 7101)
    assert conf["spark.driver.bindAddress"] == "0.0.0.0"


def _selects(selector: dict[str, Any], labels: Mapping[str, str]) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def test_network_policy_lets_executors_and_driver_reach_each_other(helm: Path) -> None:
    docs = _render(helm, [KUBERNETES_VALUES])
    conf = _spark_conf(docs)
    executor = _executor_pod(docs)
    assert executor is not None
    executor_labels = executor["metadata"]["labels"]
    driver_labels = _deployment(docs, "apply")["spec"]["template"]["metadata"]["labels"]
    capture_labels = _deployment(docs, "capture")["spec"]["template"]["metadata"]["labels"]
    spark_ports = {int(conf["spark.driver.port"]), int(conf["spark.blockManager.port"])}

    def allowed(policy: dict[str, Any], source: Mapping[str, str]) -> set[int]:
        ports: set[int] = set()
        for rule in policy["spec"]["ingress"]:
            peers = rule.get("from")
            if peers is None or any(_selects(p["podSelector"], source) for p in peers):
                ports |= {p["port"] for p in rule["ports"]}
        return ports

    def ingress(target: Mapping[str, str], source: Mapping[str, str]) -> set[int]:
        policies = [
            p
            for p in _kinds(docs, "NetworkPolicy").values()
            if _selects(p["spec"]["podSelector"], target)
        ]
        assert policies, "no policy selects the pod, so it would be open"
        return {port for p in policies for port in allowed(p, source)}

    assert spark_ports <= ingress(driver_labels, executor_labels)
    assert int(conf["spark.blockManager.port"]) in ingress(executor_labels, driver_labels)
    assert int(conf["spark.blockManager.port"]) in ingress(executor_labels, executor_labels)
    assert not spark_ports & ingress(driver_labels, capture_labels)
    # Egress is restricted in these values: the same ports are allowed out between them.
    egress = {
        port["port"]
        for policy in _kinds(docs, "NetworkPolicy").values()
        if _selects(policy["spec"]["podSelector"], executor_labels)
        for rule in policy["spec"].get("egress", [])
        if any(_selects(peer.get("podSelector", {}), driver_labels) for peer in rule.get("to", []))
        for port in rule["ports"]
    }
    assert spark_ports <= egress
    # Executors are no target of the driver's Services or disruption budget.
    for service in _kinds(docs, "Service").values():
        assert not service["spec"]["selector"].items() <= executor_labels.items()
    for budget in _kinds(docs, "PodDisruptionBudget").values():
        assert not _selects(budget["spec"]["selector"], executor_labels)


def test_executor_template_is_a_valid_pod(helm: Path, kubeconform: Path) -> None:
    for values in (KUBERNETES_VALUES, RWX_VALUES):
        executor = _executor_pod(_render(helm, [values]))
        report = _kubeconform(kubeconform, yaml.safe_dump(executor))
        assert report["resources"] == [], report["resources"]
        assert report["summary"]["valid"] == 1


def test_executors_mount_what_the_job_may_name(helm: Path) -> None:
    """Kafka client secrets and CA files are named in properties the executors' Kafka
    consumers use; a ReadWriteMany lake is mounted where the driver has it."""
    docs = _render(helm, [KUBERNETES_VALUES])
    executor = _executor_pod(docs)
    assert executor is not None
    (container,) = executor["spec"]["containers"]
    driver_mounts = {m["mountPath"]: m["name"] for m in _apply_container(docs)["volumeMounts"]}
    executor_mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for path in ("/var/run/secrets/pgdelta-cdc/kafka", "/etc/pgdelta-cdc/certs"):
        assert path in driver_mounts
        assert path in executor_mounts
    conf = _spark_conf(docs)
    assert _on_mount(conf["spark.local.dir"], _writable_mounts(executor["spec"], container))
    # Spark uses a volume named spark-local-dir-* as the executor's local dir.
    assert executor_mounts[conf["spark.local.dir"]] == "spark-local-dir-1"

    rwx = _render(helm, [RWX_VALUES])
    rwx_executor = _executor_pod(rwx)
    assert rwx_executor is not None
    driver_lake = {
        v["name"]: v for v in _deployment(rwx, "apply")["spec"]["template"]["spec"]["volumes"]
    }["lake"]
    executor_lake = {v["name"]: v for v in rwx_executor["spec"]["volumes"]}["lake"]
    assert executor_lake == driver_lake
    (claim,) = _kinds(rwx, "PersistentVolumeClaim").values()
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_no_secret_sits_in_the_kubernetes_mode_configmaps(helm: Path) -> None:
    docs = _render(helm, [KUBERNETES_VALUES])
    values = yaml.safe_load(KUBERNETES_VALUES.read_text())
    secret_name = values["lake"]["s3"]["existingSecret"]
    executor = _executor_pod(docs)
    assert executor is not None
    (executor_container,) = executor["spec"]["containers"]
    for container in (_apply_container(docs), executor_container):
        credentials = {e["name"]: e for e in container["env"] if e["name"].startswith("AWS_")}
        assert set(credentials) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        for variable in credentials.values():
            assert "value" not in variable
            assert variable["valueFrom"]["secretKeyRef"]["name"] == secret_name
    for config_map in _kinds(docs, "ConfigMap").values():
        text = json.dumps(config_map["data"])
        assert "AWS_SECRET_ACCESS_KEY" not in text or "secretKeyRef" in text
        assert not re.search(r"fs\.s3a\.(access|secret)\.key|session\.token", text)
    conf = _spark_conf(docs)
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"] == (
        "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"
    )
    assert conf["spark.hadoop.fs.s3a.endpoint"] == values["lake"]["s3"]["endpoint"]
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    # S3A's upload buffers are on the executors' scratch volume, not the small /tmp.
    executor_mounts = _writable_mounts(executor["spec"], executor_container)
    assert _on_mount(conf["spark.hadoop.fs.s3a.buffer.dir"], executor_mounts) == "emptyDir"
    assert not PurePosixPath(conf["spark.hadoop.fs.s3a.buffer.dir"]).is_relative_to("/tmp")


@pytest.mark.parametrize("values", [KUBERNETES_VALUES, OBJECT_STORE_VALUES], ids=lambda p: p.stem)
def test_an_object_store_lake_has_no_volume(helm: Path, values: Path) -> None:
    docs = _render(helm, [values])
    env = _container_env(docs, "apply")
    assert OBJECT_STORE_ROOT.match(env["APPLY_LAKE__ROOT"])
    assert OBJECT_STORE_ROOT.match(env["APPLY_LAKE__CHECKPOINT_ROOT"])
    assert _kinds(docs, "PersistentVolumeClaim") == {}
    pod = _deployment(docs, "apply")["spec"]["template"]["spec"]
    assert "persistentVolumeClaim" not in {k for v in pod["volumes"] for k in v}
    executor = _executor_pod(docs)
    if executor is not None:
        assert "persistentVolumeClaim" not in {k for v in executor["spec"]["volumes"] for k in v}


def test_workload_identity_needs_no_key(helm: Path) -> None:
    docs = _render(helm, [OBJECT_STORE_VALUES])
    conf = _spark_conf(docs)
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"] == (
        "software.amazon.awssdk.auth.credentials.WebIdentityTokenFileCredentialsProvider"
    )
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert conf["spark.hadoop.fs.s3a.connection.maximum"] == "200"  # lake.hadoopConf
    assert "env" not in _apply_container(docs)
    pod = _deployment(docs, "apply")["spec"]["template"]["spec"]
    account = _kinds(docs, "ServiceAccount")[pod["serviceAccountName"]]
    assert "eks.amazonaws.com/role-arn" in account["metadata"]["annotations"]
    # In kubernetes mode the driver's own account carries the same role, for executors.
    flags = ["--set", "apply.spark.mode=kubernetes"]
    k8s = _render(helm, [OBJECT_STORE_VALUES], flags)
    executor = _executor_pod(k8s)
    assert executor is not None
    own = _kinds(k8s, "ServiceAccount")[executor["spec"]["serviceAccountName"]]
    assert own["metadata"]["annotations"] == account["metadata"]["annotations"]
    assert own["automountServiceAccountToken"] is False


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        # Executors on other nodes cannot see a ReadWriteOnce volume, nor an emptyDir.
        (["--set", "apply.spark.mode=kubernetes"], "value must be 'ReadWriteMany'"),
        (
            ["--set", "apply.spark.mode=kubernetes", "--set", "lake.persistence.enabled=false"],
            "value must be true",
        ),
        (
            [
                *("--set", "apply.spark.mode=kubernetes"),
                *("--set", "lake.persistence.accessMode=ReadWriteOncePod"),
            ],
            "value must be 'ReadWriteMany'",
        ),
        # Tables and checkpoints on one kind of storage.
        (["--set", "lake.root=s3a://lake/tables"], "does not match pattern '^/'"),
        (["--set", "lake.root=s3://lake/tables"], "lake/root"),
        (
            [
                *("--set", "lake.root=s3a://b/t", "--set", "lake.checkpointRoot=s3a://b/c"),
                *("--set", "lake.s3.credentials=secret"),
            ],
            "existingSecret",
        ),
        (["--set", "apply.spark.conf.spark\\.hadoop\\.fs\\.s3a\\.secret\\.key=x"], "is a secret"),
        (["--set", "lake.hadoopConf.fs\\.azure\\.account\\.key\\.acct=x"], "is a secret"),
        (["--set", "lake.hadoopConf.fs\\.s3a\\.session\\.token=x"], "is a secret"),
    ],
)
def test_lakes_that_cannot_work_are_refused(helm: Path, flags: list[str], complaint: str) -> None:
    base = ["--values", str(CHART / "ci" / "default-values.yaml")]
    assert complaint in _render_error(helm, base + flags)


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (
            ["--set", "apply.spark.conf.spark\\.driver\\.port=7000"],
            "set apply.spark.kubernetes.driverPort",
        ),
        (["--set", "apply.spark.conf.spark\\.executor\\.instances=9"], "executor.instances"),
        (["--set", "apply.spark.conf.spark\\.kubernetes\\.container\\.image=x"], "set apply.image"),
        (["--set", "apply.settings.APPLY_SPARK__CONF=x"], "set apply.spark.conf"),
        (["--set", "apply.settings.APPLY_SPARK__MASTER=local[2]"], "k8s://"),
    ],
)
def test_kubernetes_mode_keeps_its_wiring(helm: Path, flags: list[str], complaint: str) -> None:
    base = ["--values", str(KUBERNETES_VALUES)]
    assert complaint in _render_error(helm, base + flags)


def test_local_mode_renders_nothing_of_kubernetes_mode(helm: Path) -> None:
    docs = _render(helm, [CHART / "ci" / "production-values.yaml"])
    assert _executor_pod(docs) is None
    assert not {"Role", "RoleBinding"} & {d["kind"] for d in docs}
    conf = _spark_conf(docs)
    assert not [k for k in conf if k.startswith(("spark.kubernetes.", "spark.driver.host"))]
    assert _container_env(docs, "apply")["APPLY_SPARK__MASTER"] == "local[4]"
