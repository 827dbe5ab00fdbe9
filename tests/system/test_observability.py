"""The observability pack and the Kubernetes extras: alert rules, dashboard, components.

Why these checks: an alert or a panel that names a metric no process exports never fires
and never draws, and nothing else would say so. So every PromQL expression is read (a small
tokenizer, :mod:`tests.promql_names`) and each metric and label it names must be exported
by the ingestor's, the collector's or the admin API's own registry. The alert rules are
regenerated from the alert table (docs/operations.md) and must equal the committed files.
The kustomize components are built with ``kubectl kustomize`` when kubectl is installed and checked
object by object against the base they extend either way.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.promql_names import Exported, PromQLError, exported, names, unknown

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
MONITORING = K8S / "components" / "monitoring"
INGRESS = K8S / "components" / "ingress"
PRODUCTION = K8S / "overlays" / "production"
DASHBOARD = MONITORING / "grafana-dashboard.json"
PROMETHEUS_LABELS = frozenset({"job", "instance", "namespace", "pod", "service", "container",
                               "endpoint"})
"""Labels Prometheus (and the Operator's relabelling) adds to every scraped series."""


def gen_alerts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_alerts", ROOT / "scripts" / "gen_alerts.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def catalog() -> dict[str, Exported]:
    """Every metric the three processes export, from their real registries."""
    from collector.metrics import CollectorMetrics
    from icefloe.manifest import ProducerStats
    from icefloe_app.api.app import AdminMetrics
    from ingestor.metrics import IngestMetrics

    ingest = IngestMetrics()
    ingest.watch_producer(ProducerStats())  # what ingestor.runtime registers at start
    found: dict[str, Exported] = {}
    for registry in (ingest.registry, CollectorMetrics().registry, AdminMetrics().registry):
        found.update(exported(registry))
    return found


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def dashboard_targets() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in board["panels"]
            for target in panel.get("targets", [])]


# --- the PromQL reader itself ---------------------------------------------------------------

def test_should_find_metrics_labels_and_grouping_in_promql():
    found = names('sum by (status) (rate(icefloe_ingest_requests_total{status=~"429|5.."}'
                  '[5m])) / ignoring(x) sum(rate(icefloe_ingest_requests_total[1h:1m])) > 1e3')
    assert found.metrics == {"icefloe_ingest_requests_total"}
    assert found.labels == {"icefloe_ingest_requests_total": {"status"}}
    assert found.grouping == {"status", "x"}
    assert names("absent(up == 1) and on() time() - x offset 5m > 0").metrics == {"up", "x"}


def test_should_refuse_unreadable_promql():
    for expr in ("rate(x[5m]", "sumx(rate(y[5m]))", '{__name__="x"}', "x{bad}"):
        with pytest.raises(PromQLError):
            names(expr)


def test_should_report_names_no_process_exports(catalog):
    assert unknown("rate(icefloe_collector_run_errors_total[5m]) > 0", catalog) == []
    assert unknown("icefloe_collector_run_errors > 0", catalog) == [
        "metric icefloe_collector_run_errors"]  # a counter is only exported as _total
    assert unknown("icefloe_ingest_ack_seconds_total", catalog) == [
        "metric icefloe_ingest_ack_seconds_total"]
    assert unknown('icefloe_collector_lag_seconds{table="x"}', catalog) == [
        "label icefloe_collector_lag_seconds{table}"]
    assert unknown("sum by (stream) (icefloe_collector_lag_seconds)", catalog) == [
        "grouping label stream"]
    assert unknown("histogram_quantile(0.9, sum by (le, transport) "
                   "(rate(icefloe_ingest_ack_seconds_bucket[5m])))", catalog) == []


# --- alert rules ----------------------------------------------------------------------------

def test_should_have_committed_the_rules_the_alert_table_generates():
    module = gen_alerts()
    files = module.rendered(module.README.read_text())
    assert set(files) == {ROOT / "deploy" / "observability" / "alerts.yaml",
                          MONITORING / "prometheusrule.yaml"}
    stale = [str(path.relative_to(ROOT)) for path, text in files.items()
             if not path.is_file() or path.read_text() != text]
    assert stale == [], f"{stale} differ from the alert table in docs/operations.md: run " \
                        "`python scripts/gen_alerts.py` and commit the result"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_alerts.py"),
                             "--check"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr


def test_should_regenerate_a_changed_table_and_refuse_a_malformed_one():
    module = gen_alerts()
    readme = module.README.read_text()
    changed = readme.replace("| `max(icefloe_collector_lag_seconds) > 60` | 5m |",
                             "| `max(icefloe_collector_lag_seconds) > 120` | 5m |")
    assert changed != readme
    plain = yaml.safe_load(module.rendered(changed)[module.RULES_FILE])
    (lagging,) = [r for r in plain["groups"][0]["rules"]
                  if r["alert"] == "IcefloeCollectorLagging"]
    assert lagging["expr"] == "max(icefloe_collector_lag_seconds) > 120"
    for broken, reason in (("| 5m | warning |", "| soon | warning |"),
                           ("| 10m | critical |", "| 10m | urgent |")):
        with pytest.raises(module.TableError):
            module.rendered(readme.replace(broken, reason, 1))


def test_should_name_only_exported_metrics_in_every_alert(catalog):
    module = gen_alerts()
    rows = module.alert_rows(module.README.read_text())
    assert len(rows) >= 8
    problems = {row["alert"]: unknown(row["expression"], catalog, PROMETHEUS_LABELS)
                for row in rows}
    assert {alert: p for alert, p in problems.items() if p} == {}


def test_should_write_the_same_rules_for_prometheus_and_the_operator():
    (plain,) = yaml_docs(ROOT / "deploy" / "observability" / "alerts.yaml")
    (rule,) = yaml_docs(MONITORING / "prometheusrule.yaml")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == plain["groups"]
    for entry in plain["groups"][0]["rules"]:
        assert set(entry) <= {"alert", "expr", "for", "labels", "annotations"}
        assert entry["labels"]["severity"] in ("critical", "warning", "info")
        assert entry["annotations"]["summary"]


def test_should_alert_on_queue_fill_against_the_configured_bound(tmp_path):
    """The queue alert divides by icefloe_collector_queue_max_entries: a collector must
    export manifest.max_entries from the moment it exists, standby included."""
    from collector.metrics import CollectorMetrics
    from collector.service import Collector
    from icefloe.config import CatalogSection, Config, ManifestSection, StoreSection
    from icefloe.store import open_async_store
    from pipeline.iceberg.catalog import open_catalog

    config = Config(store=StoreSection(url=(tmp_path / "store").as_uri()),
                    manifest=ManifestSection(max_entries=1234),
                    catalog=CatalogSection(uri=f"sqlite:///{tmp_path}/catalog.db",
                                           warehouse=(tmp_path / "warehouse").as_uri()))
    metrics = CollectorMetrics()
    Collector(config, open_async_store(config.store.url), open_catalog(config.catalog),
              engine=None, metrics=metrics)  # type: ignore[arg-type]  # never started
    assert metrics.registry.get_sample_value("icefloe_collector_queue_max_entries") == 1234


# --- dashboard ------------------------------------------------------------------------------

def test_should_draw_only_exported_metrics_on_the_dashboard(catalog):
    targets = dashboard_targets()
    assert len(targets) >= 15
    problems = {}
    for title, expr in targets:
        # Grafana's interval variables stand inside range brackets, which the reader drops
        found = unknown(expr, catalog, PROMETHEUS_LABELS)
        if found:
            problems[f"{title}: {expr}"] = found
    assert problems == {}


def test_should_cover_intake_acks_queue_lag_commit_age_and_errors():
    drawn = set()
    for _, expr in dashboard_targets():
        drawn |= names(expr).metrics
    assert {"icefloe_ingest_events_accepted_total",       # ingest rate
            "icefloe_ingest_ack_seconds_bucket",           # acknowledgements
            "icefloe_collector_queue_entries",             # queue length
            "icefloe_collector_lag_seconds",               # lag
            "icefloe_collector_last_commit_timestamp_seconds",  # commit age
            "icefloe_collector_run_errors_total",          # errors
            "icefloe_collector_dead_letter_rows_total",
            "icefloe_ingest_events_rejected_total"} <= drawn


def test_should_be_an_importable_grafana_dashboard():
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"]
    assert board["title"]
    assert board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        assert "datasource" in variables
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


# --- Kubernetes: components, overlay, admin, PDB ------------------------------------------------

def objects_of(folder: Path) -> list[dict[str, Any]]:
    """The objects a kustomization's own resource files hold (no build)."""
    (kustomization,) = yaml_docs(folder / "kustomization.yaml")
    found = []
    for resource in kustomization.get("resources", []):
        path = folder / resource
        if path.is_file():
            found.extend(yaml_docs(path))
    return found


def kustomize(folder: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the static checks above still ran")
    result = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d is not None]


def test_should_declare_components_with_existing_files():
    for folder in (MONITORING, INGRESS):
        (doc,) = yaml_docs(folder / "kustomization.yaml")
        assert doc["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
        assert doc["kind"] == "Component"
        listed = set(doc["resources"]) | {item.split("=", 1)[-1]
                                          for gen in doc.get("configMapGenerator", [])
                                          for item in gen["files"]}
        present = {p.name for p in folder.iterdir()} - {"kustomization.yaml"}
        assert listed == present, f"{folder.name}: listed {listed}, present {present}"
    (overlay,) = yaml_docs(PRODUCTION / "kustomization.yaml")
    assert overlay["resources"] == ["../standby"]
    assert overlay["components"] == ["../../components/monitoring", "../../components/ingress"]


def test_should_give_every_object_its_required_fields():
    for folder in (K8S / "base", MONITORING, INGRESS):
        for obj in objects_of(folder):
            where = f"{folder.name}: {obj.get('kind')} {obj.get('metadata', {}).get('name')}"
            assert obj["apiVersion"], where
            assert obj["kind"], where
            assert obj["metadata"]["name"], where
            if obj["kind"] != "Namespace":
                assert obj["metadata"]["namespace"] == "icefloe", where
            if obj["kind"] not in ("Namespace", "ConfigMap", "Secret", "ServiceAccount"):
                assert obj["spec"], where


def test_should_build_base_overlays_and_components_with_kustomize():
    built = kustomize(PRODUCTION)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in built}
    assert {("Deployment", "icefloe-admin"), ("Service", "icefloe-admin"),
            ("PodDisruptionBudget", "icefloe-collector"), ("ServiceMonitor", "icefloe"),
            ("PrometheusRule", "icefloe"), ("ConfigMap", "icefloe-grafana-dashboard"),
            ("Ingress", "icefloe-ingest"), ("GRPCRoute", "icefloe-ingest"),
            ("Service", "icefloe-ingestor-kafka")} <= kinds
    (ingestor,) = [o for o in built if o["kind"] == "Deployment"
                   and o["metadata"]["name"] == "icefloe-ingestor"]
    (container,) = ingestor["spec"]["template"]["spec"]["containers"]
    assert {"name": "ICEFLOE_INGESTOR_KAFKA_ADVERTISED_HOST",
            "value": "kafka.ingest.example.com"} in container["env"], "the patch applies"
    assert all(o["metadata"].get("namespace") == "icefloe" for o in built
               if o["kind"] != "Namespace")
    (rule,) = [o for o in built if o["kind"] == "PrometheusRule"]
    (committed,) = yaml_docs(MONITORING / "prometheusrule.yaml")
    assert rule["spec"] == committed["spec"]
    (board,) = [o for o in built if o["kind"] == "ConfigMap"
                and o["metadata"]["name"] == "icefloe-grafana-dashboard"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(board["data"]["icefloe.json"]) == json.loads(DASHBOARD.read_text())
    (collector,) = [o for o in built if o["kind"] == "Deployment"
                    and o["metadata"]["name"] == "icefloe-collector"]
    assert collector["spec"]["replicas"] == 2  # the production overlay keeps the standby
    for folder in (K8S / "base", K8S / "overlays" / "standby"):
        assert kustomize(folder)


def base_services() -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects_of(K8S / "base") if o["kind"] == "Service"}


def test_should_scrape_the_ingestor_and_collector_ports_that_serve_metrics():
    (monitor,) = objects_of(MONITORING)[:1]
    assert monitor["kind"] == "ServiceMonitor"
    (expression,) = monitor["spec"]["selector"]["matchExpressions"]
    selected = {name: svc for name, svc in base_services().items()
                if svc["metadata"]["labels"]["app.kubernetes.io/name"] in expression["values"]}
    assert set(selected) == {"icefloe-ingestor", "icefloe-collector"}
    ports = {p["name"] for svc in selected.values() for p in svc["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports, endpoint
        assert endpoint["path"] == "/metrics", endpoint
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == {"http", "metrics"}


def test_should_route_only_ingest_paths_and_the_ingest_grpc_service_outside():
    from icefloe.v1 import ingest_pb2
    from ingestor.http.steps import ingest_target

    services = base_services()
    objects = {o["kind"]: o for o in objects_of(INGRESS)}
    ingress = objects["Ingress"]
    for rule in ingress["spec"]["rules"]:
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            assert backend["name"] == "icefloe-ingestor"
            assert backend["port"]["name"] in {p["name"] for p in
                                               services["icefloe-ingestor"]["spec"]["ports"]}
            probe = path["path"] + {"/v1/streams/": "x/events", "/collect/": "s/t"}.get(
                path["path"], "x")
            assert path["path"] == "/openapi.json" or ingest_target(probe) is not None, path
    routed = [p["path"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]]
    for private in ("/metrics", "/healthz", "/readyz"):
        assert not any(private.startswith(prefix) for prefix in routed), private
    grpc = objects["GRPCRoute"]
    (rule,) = grpc["spec"]["rules"]
    (match,) = rule["matches"]
    assert match["method"] == {"type": "Exact", "service":
                               ingest_pb2.DESCRIPTOR.services_by_name["Ingest"].full_name}
    (backend,) = rule["backendRefs"]
    grpc_port = {p["name"]: p["port"] for p in services["icefloe-ingestor"]["spec"]["ports"]}
    assert (backend["name"], backend["port"]) == ("icefloe-ingestor", grpc_port["grpc"])


def test_should_let_drains_evict_one_collector_at_a_time():
    (pdb,) = [o for o in objects_of(K8S / "base")
              if o["kind"] == "PodDisruptionBudget"
              and o["metadata"]["name"] == "icefloe-collector"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "icefloe-collector"}


def test_should_run_the_admin_api_with_its_own_secret_tokens_and_no_exposure(tmp_path):
    from icefloe.config import load_config

    objects = objects_of(K8S / "base")
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"
                     and o["metadata"]["name"] == "icefloe-admin"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # tasks live in the process
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "icefloe-admin"
    (container,) = pod["containers"]
    assert container["args"][0] == "admin"
    (secret,) = [o for o in objects if o["kind"] == "Secret"
                 and o["metadata"]["name"] == "icefloe-admin"]
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap"]
    path = tmp_path / "icefloe.toml"
    path.write_text(configmap["data"]["icefloe.toml"])
    env = {e["name"]: e["value"] for e in container["env"]}
    env.update(secret["stringData"], ICEFLOE_CONFIG=str(path))
    config = load_config(None, env=env)
    assert config.admin.host == "0.0.0.0"
    assert config.admin.plaintext is True
    assert config.admin.tokens == (secret["stringData"]["ICEFLOE_ADMIN_TOKENS"],)
    assert config.catalog.uri.startswith("postgresql://")
    assert base_services()["icefloe-admin"]["spec"]["type"] == "ClusterIP"
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "NetworkPolicy"}
    assert policies["icefloe-admin"]["spec"]["ingress"] == [
        {"ports": [{"port": config.admin.port, "protocol": "TCP"}]}]


def test_should_split_admin_token_hashes_from_the_environment_only_between_hashes():
    """A scrypt hash line holds commas (``ln=14,r=8,p=1``): splitting the variable on every
    comma broke each default hash into pieces that are not hashes."""
    from icefloe.config import load_config
    from icefloe.tokens import hash_token

    first, second = hash_token("ifl_first-token-0001"), hash_token("ifl_second-token-002")
    config = load_config(None, env={"ICEFLOE_ADMIN_TOKENS": f"{first}, {second}"})
    assert config.admin.tokens == (first, second)
