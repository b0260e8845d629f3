"""docker-compose.yml, the Dockerfiles and the Helm chart speak the services' settings.

pydantic-settings reads only the environment variables that match a field: a name whose
first part matches nothing (``CAPTURE_POSTGRES_DSN``, one underscore short) is never
read. The services refuse such a name at start (runtime.settings_env); these tests find
it in a deployment file before anyone starts it: they walk every variable name the
deployment files set through the settings models with the services' own walk, build the
settings from the compose values, and check the wiring between the containers:
listeners, the DSN's host, the topics both services must agree on, the lake volume, and
single-replica Recreate.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic_settings import BaseSettings

from apply.settings import ApplySettings, LakeSettings
from capture.settings import CaptureSettings
from capture.settings import KafkaSettings as CaptureKafkaSettings
from runtime.settings_env import env_prefix, is_json, resolve
from tests.plugins.settings import ApplyFromArguments, CaptureFromArguments

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = ROOT / "docker-compose.yml"
CHART = ROOT / "deploy" / "helm" / "pgdelta-cdc"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

SETTINGS_BY_PREFIX: dict[str, type[BaseSettings]] = {
    "CAPTURE_": CaptureSettings,
    "APPLY_": ApplySettings,
}
SERVICE_SETTINGS: dict[str, type[BaseSettings]] = {
    "capture": CaptureSettings,
    "apply": ApplySettings,
}
# A variable name either service reads, wherever it is mentioned.
SETTING_NAME = re.compile(r"\b(?:CAPTURE|APPLY)_[A-Z0-9_]*[A-Z0-9]\b")
VALUES_REFERENCE = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


# --- walking the settings models: the services' own walk (runtime.settings_env) -------


def settings_kwargs(settings_cls: type[BaseSettings], env: dict[str, str]) -> dict[str, Any]:
    """``env`` as the nested values pydantic-settings builds from it, JSON decoded where the
    field is a list, a dict or a model."""
    values: dict[str, Any] = {}
    for name, raw in env.items():
        path, annotation = resolve(settings_cls, name)
        target = values
        for part in path[:-1]:
            target = target.setdefault(part, {})
            assert isinstance(target, dict), f"{name} nests below a value already set"
        target[path[-1]] = json.loads(raw) if is_json(annotation) else raw
    return values


def capture_settings(env: dict[str, str]) -> CaptureSettings:
    return CaptureFromArguments(**settings_kwargs(CaptureSettings, env))


def apply_settings(env: dict[str, str]) -> ApplySettings:
    return ApplyFromArguments(**settings_kwargs(ApplySettings, env))


def _unknown_names(names: set[str]) -> list[str]:
    problems = []
    for name in sorted(names):
        settings_cls = next(
            cls for prefix, cls in SETTINGS_BY_PREFIX.items() if name.startswith(prefix)
        )
        try:
            resolve(settings_cls, name)
        except LookupError as exc:
            problems.append(str(exc))
    return problems


@pytest.mark.parametrize(
    ("settings_cls", "env_name", "path"),
    [
        (CaptureSettings, "CAPTURE_POSTGRES__DSN", ("postgres", "dsn")),
        (CaptureSettings, "capture_postgres__tables", ("postgres", "tables")),
        (CaptureSettings, "CAPTURE_STATUS_INTERVAL_S", ("status_interval_s",)),
        (CaptureSettings, "CAPTURE_KAFKA__PRODUCER", ("kafka", "producer")),
        (CaptureSettings, "CAPTURE_KAFKA__PRODUCER__ACKS", ("kafka", "producer", "acks")),
        (ApplySettings, "APPLY_LAKE__CHECKPOINT_ROOT", ("lake", "checkpoint_root")),
        (ApplySettings, "APPLY_SPARK__MASTER", ("spark", "master")),
        (ApplySettings, "APPLY_SPARK", ("spark",)),
    ],
)
def test_resolve_follows_real_settings(
    settings_cls: type[BaseSettings], env_name: str, path: tuple[str, ...]
) -> None:
    assert resolve(settings_cls, env_name)[0] == path


@pytest.mark.parametrize(
    ("settings_cls", "env_name", "complaint"),
    [
        (CaptureSettings, "CAPTURE_POSTGRES_DSN", "no field 'postgres_dsn'"),
        (CaptureSettings, "CAPTURE_POSTGRES__SLOTT", "no field 'slott'"),
        (CaptureSettings, "CAPTURE_POSTGRES__DSN__HOST", "postgres.dsn is a single setting"),
        (CaptureSettings, "CAPTURE_KAFKA__PRODUCER__A__B", "kafka.producer is a map"),
        (CaptureSettings, "APPLY_KAFKA__BOOTSTRAP_SERVERS", "lacks the CAPTURE_ prefix"),
        (ApplySettings, "APPLY_POSTGRES__DSN", "no field 'postgres'"),
        (ApplySettings, "APPLY_", "no field ''"),
    ],
)
def test_resolve_rejects_names_no_setting_has(
    settings_cls: type[BaseSettings], env_name: str, complaint: str
) -> None:
    with pytest.raises(LookupError, match=re.escape(complaint)):
        resolve(settings_cls, env_name)


def test_settings_kwargs_nests_and_decodes_json_only_where_the_field_wants_it() -> None:
    kwargs = settings_kwargs(
        CaptureSettings,
        {
            "CAPTURE_POSTGRES__TABLES": '["public.a", "public.b"]',
            "CAPTURE_POSTGRES__DSN": "postgresql://u@h/db",
            "CAPTURE_KAFKA__PRODUCER": '{"linger.ms": "5"}',
            "CAPTURE_MAX_IN_FLIGHT_RECORDS": "10",
        },
    )
    assert kwargs == {
        "postgres": {"tables": ["public.a", "public.b"], "dsn": "postgresql://u@h/db"},
        "kafka": {"producer": {"linger.ms": "5"}},
        "max_in_flight_records": "10",
    }
    built = CaptureFromArguments(**kwargs)
    assert built.max_in_flight_records == 10
    assert built.kafka.producer == {"linger.ms": "5"}


def test_settings_built_here_ignore_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The one test that touches the environment: it proves the isolation the others rely on.
    monkeypatch.setenv("CAPTURE_KAFKA__TOPIC_PREFIX", "leaked")
    monkeypatch.setenv("APPLY_LAKE__ROOT", "/leaked")
    assert capture_settings({}).kafka.topic_prefix == CaptureKafkaSettings().topic_prefix
    assert apply_settings({}).lake.root == LakeSettings().root


# --- docker-compose.yml -----------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _service(compose: dict[str, Any], name: str) -> dict[str, Any]:
    service = compose["services"][name]
    assert isinstance(service, dict)
    return service


_INTERPOLATION = re.compile(r"\$\{(\w+):-([^}]*)\}")


def _environment(
    compose: dict[str, Any], name: str, shell: dict[str, str] | None = None
) -> dict[str, str]:
    """A service's environment as compose hands it over (every value a string), with
    ``${VAR:-default}`` resolved from ``shell`` as compose resolves it from its own."""
    env = _service(compose, name).get("environment", {})
    assert isinstance(env, dict), f"write {name}'s environment as a mapping"
    given = shell or {}

    def resolve(value: object) -> str:
        return _INTERPOLATION.sub(lambda m: given.get(m[1]) or m[2], str(value))

    return {str(key): resolve(value) for key, value in env.items()}


def _listeners(spec: str) -> dict[str, tuple[str, int]]:
    """``INTERNAL://kafka:19092,CONTROLLER://:9093`` -> {name: (host, port)}."""
    listeners = {}
    for entry in spec.split(","):
        name, _, address = entry.strip().partition("://")
        host, _, port = address.rpartition(":")
        listeners[name] = (host, int(port))
    return listeners


def _published_container_ports(service: dict[str, Any]) -> set[int]:
    return {int(str(mapping).rsplit(":", 1)[-1].split("/")[0]) for mapping in service["ports"]}


def test_compose_runs_the_four_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "kafka", "capture", "apply", "registry"}
    assert _service(compose, "registry")["profiles"] == ["registry"], "only when asked for"


def test_compose_switches_both_services_to_the_registry_together(
    compose: dict[str, Any],
) -> None:
    plain = capture_settings(_environment(compose, "capture"))
    assert plain.kafka.encoding == "single-object"
    assert plain.kafka.registry.url is None
    assert apply_settings(_environment(compose, "apply")).kafka.registry.url is None
    shell = {
        "CDC_ENCODING": "registry",
        "CDC_SCHEMA_REGISTRY_URL": "http://registry:8080/apis/ccompat/v7",
    }
    capture = capture_settings(_environment(compose, "capture", shell))
    apply = apply_settings(_environment(compose, "apply", shell))
    assert capture.kafka.encoding == "registry"
    assert capture.kafka.registry.url == apply.kafka.registry.url
    assert capture.kafka.registry.url is not None
    assert capture.kafka.registry.url.startswith("http://registry:8080/")
    published = _published_container_ports(_service(compose, "registry"))
    assert 8080 in published


def test_postgres_runs_with_logical_decoding(compose: dict[str, Any]) -> None:
    postgres = _service(compose, "postgres")
    assert postgres["image"] == "postgres:17"
    command = postgres["command"]
    assert command[0] == "postgres"
    options = dict(
        value.split("=", 1)
        for flag, value in zip(command[1::2], command[2::2], strict=True)
        if flag == "-c"
    )
    assert options["wal_level"] == "logical"
    assert int(options["max_replication_slots"]) >= 1
    assert int(options["max_wal_senders"]) >= 1
    assert 5432 in _published_container_ports(postgres)
    assert "pg_isready" in postgres["healthcheck"]["test"]


def test_postgres_init_script_is_mounted_and_exists(compose: dict[str, Any]) -> None:
    mounts = [str(m) for m in _service(compose, "postgres")["volumes"]]
    init = [m for m in mounts if ":/docker-entrypoint-initdb.d/" in m]
    assert len(init) == 1, mounts
    source = init[0].split(":", 1)[0]
    assert (ROOT / source).is_file(), f"{source} is mounted but missing"


def test_kafka_is_kraft_combined_without_topic_auto_creation(compose: dict[str, Any]) -> None:
    kafka = _service(compose, "kafka")
    env = _environment(compose, "kafka")
    assert kafka["image"] == "apache/kafka:4.1.1"
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    listeners = _listeners(env["KAFKA_LISTENERS"])
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == set(protocols), "every listener needs a security protocol"
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    voter_id, _, voter = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].partition("@")
    assert voter_id == env["KAFKA_NODE_ID"]
    assert voter == f"kafka:{listeners[controller][1]}"
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in listeners
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"


def test_kafka_healthcheck_asks_one_of_its_own_listeners(compose: dict[str, Any]) -> None:
    kafka = _service(compose, "kafka")
    test = kafka["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    argv = shlex.split(test[1])
    assert argv[0] == "/opt/kafka/bin/kafka-broker-api-versions.sh"
    host, _, port = argv[argv.index("--bootstrap-server") + 1].partition(":")
    assert host == "localhost"
    ports = {p for _, p in _listeners(_environment(compose, "kafka")["KAFKA_LISTENERS"]).values()}
    assert int(port) in ports


def test_services_wait_for_healthy_dependencies(compose: dict[str, Any]) -> None:
    expected = {"capture": {"postgres", "kafka"}, "apply": {"kafka"}}
    for name, needs in expected.items():
        depends_on = _service(compose, name)["depends_on"]
        assert set(depends_on) >= needs, name
        for dependency in needs:
            assert depends_on[dependency]["condition"] == "service_healthy", (name, dependency)
            assert "healthcheck" in _service(compose, dependency), dependency


@pytest.mark.parametrize("service", ["capture", "apply"])
def test_every_compose_variable_is_a_setting(compose: dict[str, Any], service: str) -> None:
    settings_cls = SERVICE_SETTINGS[service]
    env = _environment(compose, service)
    assert env
    prefix = env_prefix(settings_cls)
    assert [k for k in env if not k.startswith(prefix)] == [], f"only {prefix}* settings"
    assert _unknown_names(set(env)) == []


def test_compose_environment_builds_valid_settings(compose: dict[str, Any]) -> None:
    capture = capture_settings(_environment(compose, "capture"))
    apply = apply_settings(_environment(compose, "apply"))
    postgres_env = _environment(compose, "postgres")
    assert capture.postgres.tables == ["public.orders"]
    assert capture.postgres.password is not None
    assert capture.postgres.password.get_secret_value() == postgres_env["POSTGRES_PASSWORD"]
    assert apply.spark.master == "local[2]"
    assert apply.lake.root == "/lake/tables"
    assert apply.lake.checkpoint_root == "/lake/checkpoints"


def test_capture_dsn_names_the_postgres_service_without_a_password(
    compose: dict[str, Any],
) -> None:
    dsn = urlsplit(_environment(compose, "capture")["CAPTURE_POSTGRES__DSN"])
    postgres_env = _environment(compose, "postgres")
    assert dsn.scheme in {"postgresql", "postgres"}
    assert dsn.hostname == "postgres"
    assert dsn.port == 5432
    assert dsn.password is None, "the password belongs in CAPTURE_POSTGRES__PASSWORD"
    assert dsn.username == postgres_env["POSTGRES_USER"]
    assert dsn.path.lstrip("/") == postgres_env["POSTGRES_DB"]


def test_captured_tables_exist_with_a_primary_key(compose: dict[str, Any]) -> None:
    init_sql = (ROOT / "deploy" / "compose" / "postgres-init.sql").read_text()
    created = dict(re.findall(r"CREATE TABLE (\w+\.\w+) \((.*?)\n\);", init_sql, flags=re.DOTALL))
    for table in capture_settings(_environment(compose, "capture")).postgres.tables:
        assert table in created, f"{table} is captured but deploy/compose never creates it"
        assert "PRIMARY KEY" in created[table]


def test_services_bootstrap_from_the_internal_kafka_listener(compose: dict[str, Any]) -> None:
    kafka_env = _environment(compose, "kafka")
    advertised = _listeners(kafka_env["KAFKA_ADVERTISED_LISTENERS"])
    bound = _listeners(kafka_env["KAFKA_LISTENERS"])
    internal = [name for name, (host, _) in advertised.items() if host == "kafka"]
    assert len(internal) == 1, f"one listener must advertise the service name: {advertised}"
    host, port = advertised[internal[0]]
    assert bound[internal[0]][1] == port, "advertised and bound ports of a listener differ"
    external = [name for name in advertised if name not in internal]
    assert {advertised[name][1] for name in external} <= _published_container_ports(
        _service(compose, "kafka")
    ), "the host's listener must be published"
    expected = f"{host}:{port}"
    assert capture_settings(_environment(compose, "capture")).kafka.bootstrap_servers == expected
    assert apply_settings(_environment(compose, "apply")).kafka.bootstrap_servers == expected


def test_capture_and_apply_agree_on_the_topics(compose: dict[str, Any]) -> None:
    capture = capture_settings(_environment(compose, "capture")).kafka
    apply = apply_settings(_environment(compose, "apply")).kafka
    assert capture.topic_prefix == apply.topic_prefix
    assert capture.control_topic == apply.control_topic
    assert capture.schema_topic == apply.schema_topic


def test_the_lake_lives_on_a_named_volume(compose: dict[str, Any]) -> None:
    apply = apply_settings(_environment(compose, "apply"))
    mounts = dict(str(m).split(":", 1) for m in _service(compose, "apply")["volumes"])
    lake_volume = next(source for source, target in mounts.items() if target == "/lake")
    assert lake_volume in compose["volumes"], "a named volume, so the lake outlives containers"
    for path in (apply.lake.root, apply.lake.checkpoint_root):
        assert path.startswith("/lake/"), path


# --- Dockerfiles -------------------------------------------------------------------------


def _dockerfile(compose: dict[str, Any], service: str) -> str:
    build = _service(compose, service)["build"]
    assert build["context"] == "."
    path = ROOT / str(build["dockerfile"])
    assert path.is_file(), f"{service} builds from {path}, which is missing"
    return path.read_text()


def _instructions(dockerfile: str, keyword: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", dockerfile)
    return [
        line.split(None, 1)[1]
        for line in joined.splitlines()
        if line.strip().upper().startswith(keyword + " ")
    ]


@pytest.mark.parametrize("service", ["capture", "apply"])
def test_images_start_their_service_as_non_root(compose: dict[str, Any], service: str) -> None:
    dockerfile = _dockerfile(compose, service)
    assert _instructions(dockerfile, "ENTRYPOINT")[-1] == f'["python", "-m", "{service}"]'
    user = _instructions(dockerfile, "USER")[-1]
    assert user.split(":")[0] not in {"root", "0"}


def test_capture_image_installs_no_spark(compose: dict[str, Any]) -> None:
    runs = " ".join(_instructions(_dockerfile(compose, "capture"), "RUN"))
    assert re.search(r"pip install \.(\s|$)", runs)
    assert "[apply]" not in runs
    assert "FROM python:3.11-slim" in _dockerfile(compose, "capture")


def test_apply_image_puts_the_resolved_jars_where_it_says(compose: dict[str, Any]) -> None:
    dockerfile = _dockerfile(compose, "apply")
    runs = " ".join(_instructions(dockerfile, "RUN"))
    pom = re.search(r"mvn .*?-f (\S+) dependency:copy-dependencies", runs)
    assert pom is not None
    assert (ROOT / pom.group(1)).is_file()
    assert '".[apply]"' in runs
    jars_dir = next(
        env.split("=", 1)[1]
        for env in _instructions(dockerfile, "ENV")
        if env.startswith("APPLY_SPARK__JARS_DIR=")
    )
    copies = _instructions(dockerfile, "COPY")
    assert f"--from=jars /jars {jars_dir}" in copies


# --- Helm chart --------------------------------------------------------------------------


def _chart_templates() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((CHART / "templates").iterdir())}


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    loaded = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == CHART.name


def test_chart_names_only_real_settings(values: dict[str, Any]) -> None:
    texts = [*_chart_templates().values(), (CHART / "values.yaml").read_text()]
    names = {name for text in texts for name in SETTING_NAME.findall(text)}
    assert any(n.startswith("CAPTURE_") for n in names)
    assert any(n.startswith("APPLY_") for n in names)
    assert _unknown_names(names) == []


def test_chart_sets_everything_compose_sets(compose: dict[str, Any]) -> None:
    templates = _chart_templates().values()
    in_templates = {n for t in templates for n in SETTING_NAME.findall(t)}
    # Settings both services share are written once, under either service's prefix.
    shared = {n for t in templates for n in re.findall(r'printf "%s([A-Z_]+)" \$prefix', t)}
    in_templates |= {f"{service}_{name}" for name in shared for service in ("CAPTURE", "APPLY")}
    for service in ("capture", "apply"):
        # The chart hands a secret over as a mounted file (X_FILE) where compose sets X.
        missing = {
            name
            for name in _environment(compose, service)
            if name not in in_templates and f"{name}_FILE" not in in_templates
        }
        assert missing == set(), f"the chart never sets {sorted(missing)}"


def test_chart_reads_only_values_that_exist(values: dict[str, Any]) -> None:
    for name, text in _chart_templates().items():
        for reference in VALUES_REFERENCE.findall(text):
            node: Any = values
            for key in reference.strip(".").split("."):
                assert isinstance(node, dict), f"{name}: .Values{reference}"
                assert key in node, f"{name} reads .Values{reference}, missing from values.yaml"
                node = node[key]


def test_chart_takes_the_password_from_an_existing_secret(values: dict[str, Any]) -> None:
    templates = _chart_templates()
    assert not any(re.search(r"^kind:\s*Secret\b", t, re.M) for t in templates.values())
    assert "existingSecret" in values["postgres"]

    def literal_passwords(node: Any) -> list[str]:
        if isinstance(node, dict):
            return [
                key
                for key, value in node.items()
                if "password" in key.lower() and key != "passwordKey" and value
            ] + [found for value in node.values() for found in literal_passwords(value)]
        return []

    assert literal_passwords(values) == []
    # The Secret is mounted as a file; the ConfigMap only says where (rendered and checked
    # in test_helm_chart.py).
    assert re.search(r"secretName: \{\{ \. \}\}", templates["capture-deployment.yaml"])
    assert "CAPTURE_POSTGRES__PASSWORD_FILE" in templates["configmap-capture.yaml"]
    assert not re.search(r"CAPTURE_POSTGRES__PASSWORD\b", templates["configmap-capture.yaml"])


@pytest.mark.parametrize("template", ["capture-deployment.yaml", "apply-deployment.yaml"])
def test_chart_runs_one_replica_replaced_with_recreate(template: str) -> None:
    text = _chart_templates()[template]
    assert re.search(r"^kind: Deployment$", text, re.M)
    assert re.findall(r"^[ \t]*replicas:.*$", text, re.M) == ["  replicas: 1"]
    assert re.search(r"^  strategy:\n    type: Recreate$", text, re.M)


def test_chart_lake_paths_are_on_the_mounted_volume(values: dict[str, Any]) -> None:
    lake = values["lake"]
    settings = apply_settings(
        {"APPLY_LAKE__ROOT": lake["root"], "APPLY_LAKE__CHECKPOINT_ROOT": lake["checkpointRoot"]}
    )
    for path in (settings.lake.root, settings.lake.checkpoint_root):
        assert path.startswith(lake["mountPath"].rstrip("/") + "/"), path


def test_deploy_doc_names_only_real_settings() -> None:
    names = set(SETTING_NAME.findall(DEPLOY_DOC.read_text()))
    assert names
    assert _unknown_names(names) == []
