"""deploy/ checked with the real tools: promtool (rules, rule unit tests, scrape
configs), kustomize (base and example overlay rendered), the Kubernetes schemas of
``kubernetes-validate`` plus the vendored KEDA ScaledObject schema, the Grafana
dashboard and the compose file. The tools come from ``deploy/tools/tools.sh`` (built
from the Go module proxy, cached); a tool that cannot be built fails these tests."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from stepstream.config import normalize_broker
from stepstream.metrics import ApiMetrics, Metrics

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "rules" / "stepstream.yml"
RULE_TESTS = DEPLOY / "prometheus" / "tests" / "stepstream.test.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "stepstream.json"
KEDA_SCHEMA = DEPLOY / "k8s" / "schemas" / "keda-scaledobject-v1alpha1.json"
OVERLAYS = {
    "base": DEPLOY / "k8s" / "base",
    "example": DEPLOY / "k8s" / "overlays" / "example",
    "secure": DEPLOY / "k8s" / "overlays" / "secure",
}
COMMANDS = {"worker", "compactor", "api", "demo"}  # subcommands the manifests may run
KUBERNETES_VERSION = "1.33.0"


@cache
def tool(name: str) -> str:
    proc = subprocess.run([str(DEPLOY / "tools" / "tools.sh"), "path", name], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"deploy/tools/tools.sh could not provide {name}:\n{proc.stderr[-3000:]}", pytrace=False)
    return proc.stdout.strip()


def run(args: list[str], cwd: Path = REPO) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


# -- metric names -------------------------------------------------------------------------

_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "summary": ("_sum", "_count", "")}


def declared_metrics() -> set[str]:
    names: set[str] = set()
    for metrics in (Metrics(), ApiMetrics()):
        for family in metrics.registry.collect():
            names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def recorded_names() -> set[str]:
    rules = yaml.safe_load(RULES.read_text())
    return {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}


def names_in(expr: str) -> set[str]:
    return set(re.findall(r"\bstepstream(?:_[a-z0-9_]+|:[a-z0-9_:]+)", expr))


def alert_rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load(RULES.read_text())
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


# -- Prometheus -----------------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    out = run([tool("promtool"), "check", "rules", str(RULES)])
    assert "SUCCESS" in out


def test_promtool_rule_unit_tests_pass_and_fire_every_alert() -> None:
    out = run([tool("promtool"), "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent)
    assert "SUCCESS" in out
    fired = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    alerts = {r["alert"] for r in alert_rules()}
    assert alerts - fired == set(), "alerts without a unit test that fires them"
    wanted = {"StepstreamConsumerLagHigh", "StepstreamConsumerLagGrowing", "StepstreamNoProgress",
              "StepstreamDeadLettersRising", "StepstreamSinkErrors", "StepstreamCompactorFailing",
              "StepstreamCompactorStale"}  # fmt: skip
    assert wanted <= alerts


def test_every_alert_has_a_severity_a_summary_and_a_runbook_line() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        runbook = rule["annotations"]["runbook"]
        assert rule["annotations"]["summary"] and runbook and "\n" not in runbook, rule["alert"]


def test_promtool_accepts_both_scrape_configs() -> None:
    for config in ("prometheus.yml", "kubernetes.yml"):
        run([tool("promtool"), "check", "config", str(DEPLOY / "prometheus" / config)])


def test_rules_read_only_declared_metrics() -> None:
    declared = declared_metrics() | recorded_names()
    for rule in yaml.safe_load(RULES.read_text())["groups"]:
        for r in rule["rules"]:
            used = names_in(r["expr"])
            assert used, r
            assert used <= declared, f"{r.get('alert') or r.get('record')}: undeclared {used - declared}"


# -- Grafana -------------------------------------------------------------------------------------


def dashboard_exprs(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def test_dashboard_queries_read_only_declared_metrics_and_cover_the_issue() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    declared = declared_metrics() | recorded_names()
    used: set[str] = set()
    for title, expr in dashboard_exprs(dashboard):
        names = names_in(expr)
        assert names, f"{title}: a query that reads no stepstream metric"
        assert names <= declared, f"{title}: undeclared {names - declared}"
        used |= names
    for wanted in (
        "stepstream_consumer_lag_records", "stepstream_ingest_lag_seconds_bucket", "stepstream_events_total",
        "stepstream_dead_letters_total", "stepstream_sink_write_seconds_bucket", "stepstream_thinking_flushes_total",
        "stepstream_clipped_bodies_total", "stepstream_open_runs", "stepstream_compactor_passes_total",
    ):  # fmt: skip
        assert wanted in used, f"the dashboard has no panel on {wanted}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "stepstream"


def test_grafana_provisioning_points_at_the_dashboard_and_the_datasource() -> None:
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/stepstream.yaml").read_text())
    assert datasources["datasources"][0]["uid"] == "prometheus"
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == providers["providers"][0]["options"]["path"]
    assert (DEPLOY / "grafana/dashboards").is_dir() and (DEPLOY / "grafana/provisioning").is_dir()


# -- Kubernetes --------------------------------------------------------------------------------


@cache
def rendered(overlay: str) -> list[dict[str, Any]]:
    out = run([tool("kustomize"), "build", str(OVERLAYS[overlay])])
    return [doc for doc in yaml.safe_load_all(out) if doc]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


# KEDA's TriggerAuthentication (no schema is kept here): the shape the secure overlay uses.
TRIGGER_AUTHENTICATION = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["secretTargetRef"],
            "properties": {
                "secretTargetRef": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["parameter", "name", "key"],
                        "properties": {"parameter": {"type": "string"}, "name": {"type": "string"}, "key": {"type": "string"}},
                    },
                }
            },
        },
    },
}


def validate(doc: dict[str, Any]) -> None:
    if doc["kind"] == "ScaledObject":
        jsonschema.Draft202012Validator(json.loads(KEDA_SCHEMA.read_text())).validate(doc)
    elif doc["kind"] == "TriggerAuthentication":
        jsonschema.Draft202012Validator(TRIGGER_AUTHENTICATION).validate(doc)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_manifests_render_and_validate_offline(overlay: str) -> None:
    docs = rendered(overlay)
    kinds = sorted(d["kind"] for d in docs)
    assert {"ConfigMap", "Deployment", "PodDisruptionBudget", "ScaledObject", "Service"} <= set(kinds)
    for doc in docs:
        try:
            validate(doc)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            pytest.fail(f"{overlay}: {doc['kind']} {doc['metadata']['name']} is invalid: {exc}", pytrace=False)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_manifests_agree_with_the_settings(overlay: str) -> None:
    docs = rendered(overlay)
    settings = one(docs, "ConfigMap", "stepstream-settings")["data"]
    worker = one(docs, "Deployment", "stepstream-worker")
    container = worker["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert settings["STEPSTREAM_WEB_HOST"] == "0.0.0.0"
    # KEDA: the raw topic's lag only, at most one worker per partition.
    scaled = one(docs, "ScaledObject", "stepstream-worker")["spec"]
    assert scaled["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert [t["type"] for t in scaled["triggers"]] == ["kafka"]
    trigger = scaled["triggers"][0]["metadata"]
    assert trigger["topic"] == settings["STEPSTREAM_TOPIC"]
    assert trigger["consumerGroup"] == settings["STEPSTREAM_APP_ID"]
    assert trigger["bootstrapServers"] == normalize_broker(settings["STEPSTREAM_BROKER"])
    assert scaled["maxReplicaCount"] == int(settings["STEPSTREAM_PARTITIONS"])
    # The budget covers exactly the worker pods.
    pdb = one(docs, "PodDisruptionBudget", "stepstream-worker")["spec"]
    labels = worker["spec"]["template"]["metadata"]["labels"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["selector"]["matchLabels"] == worker["spec"]["selector"]["matchLabels"]
    compactor = one(docs, "Deployment", "stepstream-compactor")["spec"]
    assert compactor["replicas"] == 1 and compactor["strategy"]["type"] == "Recreate"
    api = one(docs, "Deployment", "stepstream-api")
    assert one(docs, "Service", "stepstream-api")["spec"]["selector"] == api["spec"]["selector"]["matchLabels"]
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]
        for c in pod["spec"]["containers"]:
            assert c["args"][0] in COMMANDS, c["args"]
            port = str(c["ports"][0]["containerPort"])
            assert pod["metadata"]["annotations"]["prometheus.io/port"] == port
        assert pod["metadata"]["labels"]["app.kubernetes.io/part-of"] == "stepstream"


def test_the_secure_overlay_mounts_each_components_credentials_from_secrets() -> None:
    docs = rendered("secure")
    settings = one(docs, "ConfigMap", "stepstream-settings")["data"]
    assert settings["STEPSTREAM_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert settings["STEPSTREAM_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert settings["STEPSTREAM_CREATE_TOPICS"] == "false"
    assert not any("PASSWORD" in key and not key.endswith("_FILE") for key in settings)
    secrets_of = {}
    for name, user in (("stepstream-worker", "worker"), ("stepstream-compactor", "compactor")):
        pod = one(docs, "Deployment", name)["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["STEPSTREAM_KAFKA_SASL_USERNAME"] == user
        assert "STEPSTREAM_KAFKA_SASL_PASSWORD" not in env
        mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        for path in (env["STEPSTREAM_KAFKA_SASL_PASSWORD_FILE"], settings["STEPSTREAM_KAFKA_SSL_CAFILE"]):
            mount = mounts[path]
            assert mount["readOnly"] is True and "secret" in volumes[mount["name"]]
        secrets_of[name] = volumes[mounts[env["STEPSTREAM_KAFKA_SASL_PASSWORD_FILE"]]["name"]]["secret"]["secretName"]
    assert len(set(secrets_of.values())) == 2  # a principal, and a password, per component
    api = one(docs, "Deployment", "stepstream-api")["spec"]["template"]["spec"]["containers"][0]
    assert not any(e["name"].startswith("STEPSTREAM_KAFKA_SASL") for e in api.get("env", []))
    trigger = one(docs, "ScaledObject", "stepstream-worker")["spec"]["triggers"][0]
    auth = one(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    assert {ref["parameter"] for ref in auth["spec"]["secretTargetRef"]} == {"sasl", "username", "password", "tls", "ca"}
    assert not any(d["kind"] == "Secret" and "password" in json.dumps(d).lower() for d in docs)


def test_the_validators_refuse_broken_manifests() -> None:
    """The offline validation is live: a wrong field fails it."""
    docs = rendered("base")
    worker = copy.deepcopy(one(docs, "Deployment", "stepstream-worker"))
    worker["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = ["http"]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(worker)
    pdb = copy.deepcopy(one(docs, "PodDisruptionBudget", "stepstream-worker"))
    pdb["spec"]["maxUnavailabel"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(pdb)
    scaled = copy.deepcopy(one(docs, "ScaledObject", "stepstream-worker"))
    scaled["spec"]["maxReplicas"] = scaled["spec"].pop("maxReplicaCount")
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)


# -- compose ------------------------------------------------------------------------------------


def test_compose_file_names_the_stack() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"kafka", "worker", "compactor", "api", "prometheus", "grafana"}
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert services["prometheus"]["image"].startswith("prom/prometheus:v")
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    ports = {}
    for name in ("worker", "compactor", "api"):
        service = services[name]
        assert service["image"] == "stepstream:local"
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        assert service["command"][0] in COMMANDS and service["command"][0] == name
        env = service["environment"]
        assert normalize_broker(env["STEPSTREAM_BROKER"]) == "kafka:9092"
        assert env["STEPSTREAM_WEB_HOST"] == "0.0.0.0"
        if "--port" in service["command"]:
            ports[name] = int(service["command"][service["command"].index("--port") + 1])
        else:
            ports[name] = int(env["STEPSTREAM_COMPACTOR_WEB_PORT" if name == "compactor" else "STEPSTREAM_WEB_PORT"])
    host_ports: list[int] = []
    for service in services.values():
        for mapping in service.get("ports", []):
            first, _, last = str(mapping).split(":")[0].partition("-")
            host_ports.extend(range(int(first), int(last or first) + 1))
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), f"compose mounts a missing {source}"
    assert len(host_ports) == len(set(host_ports)), f"host ports overlap: {sorted(host_ports)}"
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {}
    for job in scrape["scrape_configs"]:
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, _, port = target.partition(":")
                targets[host] = int(port)
        for dns in job.get("dns_sd_configs", []):
            for host in dns["names"]:
                targets[host] = dns["port"]
    assert targets == ports
