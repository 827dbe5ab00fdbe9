"""The Terraform module's IAM policies, run: real icefloe processes against an S3 that
enforces them.

Each task role's policy is computed from deploy/terraform/*.tf by :mod:`tests.tf_eval`
(locals, variable defaults, the module's interpolations; anything else is refused by name),
with ``catalog = "postgres"`` (a SQL catalog; a SQLite file stands in for RDS here). A moto
server in its own process (:mod:`tests.iam_moto_server`) holds one IAM user per role with
exactly that policy and enforces it. Then the real ``icefloe ingestor``, ``icefloe admin``
and ``icefloe collector`` run with those users' keys and the module's own environment
(store URL, control URL, warehouse): each starts and does its work, each is refused what
it must not do, every statement is shown to be used by a recorded authorization (or is
listed below with the reason moto cannot exercise it), and removing a statement the
processes need makes them fail.

Limits of moto's enforcement, said where they matter: it ignores ``StringLike`` conditions
(``ListBucket`` on a prefix is granted on any prefix) and never consults KMS.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.exceptions import ClientError
from process_support import Child, child_env, wait_for
from tf_eval import ACCOUNT_ID, Module

from icefloe.tokens import hash_token

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM = ROOT / "deploy" / "terraform"
ROLES = ("ingestor", "collector", "admin")
ADMIN_TOKEN = "ifl_iam-test-admin-token-0123456789abcdef"
SCHEMA_REGISTRY_CT = "application/vnd.schemaregistry.v1+json"
OVERRIDES = {"catalog": "postgres"}
CLICK_SCHEMA = {"type": "record", "name": "Click", "namespace": "test.iam",
                "fields": [{"name": "url", "type": "string"}]}
"""An Avro stream's schema: with it in the config the ingestors read the schema registry
document at start and keep the stream's writer schema in it; the collector reads it each run."""

NOT_EXERCISED = {
    ("ingestor", "UseBucketKey"): "moto never consults KMS for SSE-KMS buckets",
    ("collector", "UseBucketKey"): "moto never consults KMS for SSE-KMS buckets",
    ("admin", "UseBucketKey"): "moto never consults KMS for SSE-KMS buckets",
    ("ingestor", "ListControlPrefix"): "only for S3's 404-vs-403 on a missing key; moto "
                                       "answers 404 without it and icefloe never lists here",
    ("admin", "ListControlPrefix"): "only for S3's 404-vs-403 on a missing key (a fresh "
                                    "registry); moto answers 404 without it",
}
"""Statements no test here can show in use, each with the reason. The check below fails if
one of them *is* used (then it belongs to the proven set) or if any other is unused."""


@functools.cache
def module() -> Module:
    return Module(TERRAFORM, OVERRIDES)


@functools.cache
def policies() -> dict[str, dict[str, Any]]:
    found = module().role_policies(ROLES)
    assert set(found) == set(ROLES), f"task roles with inline policies: {sorted(found)}"
    return found


@dataclass
class World:
    """The enforcing moto server, its recorded decisions, and one user per role."""

    endpoint: str
    record: Path
    tmp: Path
    config: Path
    keys: dict[str, tuple[str, str]] = field(default_factory=dict)

    def client(self, user: str, service: str = "s3") -> Any:
        key, secret = self.keys[user]
        return boto3.client(service, endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=key, aws_secret_access_key=secret)

    def add_user(self, name: str, policy: dict[str, Any]) -> None:
        iam = self.client("operator", "iam")
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="task-role",
                            PolicyDocument=json.dumps(policy))
        made = iam.create_access_key(UserName=name)["AccessKey"]
        self.keys[name] = (made["AccessKeyId"], made["SecretAccessKey"])

    def decisions(self, user: str) -> list[dict[str, Any]]:
        lines = self.record.read_text().splitlines()
        return [d for d in map(json.loads, lines) if d["user"] == user]

    def env(self, user: str, role: str) -> dict[str, str]:
        """The module's environment for ``role`` (main.tf), made local: loopback, free
        ports, the moto endpoint, a SQLite catalog for the RDS one, ``user``'s keys."""
        tf = module()
        items = tf.local("environment_common") + tf.local(f"environment_{role}")
        if role == "ingestor" and tf.var("enable_kafka"):  # as ecs.tf concatenates them
            items += tf.local("environment_kafka")
        env = child_env()
        env.update({item["name"]: str(item["value"]) for item in items})
        # the NLB's name resolves nowhere here: advertise the loopback listener itself
        # (test_deploy.py checks what the module advertises)
        env.pop("ICEFLOE_INGESTOR_KAFKA_ADVERTISED_HOST", None)
        env.pop("ICEFLOE_INGESTOR_KAFKA_ADVERTISED_PORT", None)
        key, secret = self.keys[user]
        env.update({
            "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "ICEFLOE_CONFIG": str(self.config),
            "ICEFLOE_STORE_ENDPOINT_URL": self.endpoint,
            "ICEFLOE_DATA_DIR": str(self.tmp / f"data-{user}"),
            "ICEFLOE_CATALOG_URI": "sqlite:///" + str(self.tmp / "catalog.db"),
            "HOME": str(self.tmp),
            "PYTHONPATH": str(ROOT),  # this checkout's icefloe, wherever the venv points
            "ICEFLOE_INGESTOR_HOST": "127.0.0.1", "ICEFLOE_INGESTOR_HTTP_PORT": "0",
            "ICEFLOE_INGESTOR_GRPC_PORT": "0", "ICEFLOE_INGESTOR_KAFKA_PORT": "0",
            "ICEFLOE_COLLECTOR_HOST": "127.0.0.1", "ICEFLOE_COLLECTOR_METRICS_PORT": "0",
            "ICEFLOE_COLLECTOR_SPARK_DRIVER_MEMORY": "1g",
            "ICEFLOE_COLLECTOR_COMMIT_INTERVAL_S": "0.5",
            "ICEFLOE_INGESTOR_FLUSH_TIMEOUT_S": "5",  # a refused append answers in 5 s
            "ICEFLOE_ADMIN_HOST": "127.0.0.1", "ICEFLOE_ADMIN_PORT": "0",
            # retention on: the collector indexes each run before its ack (RetentionIndex)
            "ICEFLOE_COLLECTOR_KEEP_BATCHES_S": "3600",
        })
        return env

    def start(self, user: str, role: str) -> Child:
        return Child([role, "--log-format", "text"], self.tmp, self.tmp / f"{user}.log",
                     self.env(user, role))

    def bucket(self, name: str) -> str:
        return str(module().local(name))

    def data_keys(self, prefix: str) -> list[str]:
        listed = self.client("operator").list_objects_v2(
            Bucket=self.bucket("bucket_name"), Prefix=prefix)
        return [o["Key"] for o in listed.get("Contents", [])]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("iam")
    record = tmp / "decisions.jsonl"
    record.touch()
    env = {**child_env(), "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "iam_moto_server.py"),
                               str(record)], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        endpoint = server.stdout.readline().strip()
        assert endpoint.startswith("http://127.0.0.1:"), endpoint
        config = tmp / "icefloe.toml"
        (tmp / "click.avsc").write_text(json.dumps(CLICK_SCHEMA))
        # the module's config file, plus an Avro stream (the schema registry document's
        # statements), plus what the module gives pyiceberg through the environment on AWS
        # (the S3 endpoint here is moto's)
        config.write_text((TERRAFORM / "icefloe.toml").read_text()
                          + '\n[[streams]]\nname = "clicks"\ntable = "web.clicks"\n'
                          'format = "avro"\nschema = { schema_file = "click.avsc" }\n'
                          + "\n[catalog]\n"
                          f'properties = {{ "s3.endpoint" = "{endpoint}", '
                          '"s3.region" = "us-east-1" }\n'
                          # what admin_count = 1 asks of an operator: a token hash
                          f'[admin]\ntokens = ["{hash_token(ADMIN_TOKEN, log2_n=10)}"]\n')
        built = World(endpoint, record, tmp, config)
        setup(built, env)
        yield built
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(30)


def setup(world: World, env: dict[str, str]) -> None:
    """Before enforcement: an operator user (everything) and the module's two buckets;
    then enforcement on, and one user per role with exactly the module's policy."""
    plain = boto3.client("iam", endpoint_url=world.endpoint, region_name="us-east-1",
                         aws_access_key_id="testing", aws_secret_access_key="testing")
    plain.create_user(UserName="operator")
    plain.put_user_policy(UserName="operator", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    made = plain.create_access_key(UserName="operator")["AccessKey"]
    world.keys["operator"] = (made["AccessKeyId"], made["SecretAccessKey"])
    s3 = boto3.client("s3", endpoint_url=world.endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    for name in ("bucket_name", "control_bucket_name"):
        s3.create_bucket(Bucket=world.bucket(name))
    httpx.post(f"{world.endpoint}/moto-api/reset-auth", content=b"0").raise_for_status()
    for role, policy in policies().items():
        world.add_user(role, policy)


# --- helpers --------------------------------------------------------------------------------

def denied(call: Any, **kwargs: Any) -> bool:
    try:
        call(**kwargs)
    except ClientError as exc:
        return exc.response["Error"]["Code"] in ("AccessDenied", "403")
    return False


def matches(pattern: str, value: str) -> bool:
    """IAM's wildcard match (``*`` any run, ``?`` one character)."""
    import fnmatch

    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def statement_used(statement: dict[str, Any], decisions: list[dict[str, Any]]) -> bool:
    actions = statement["Action"] if isinstance(statement["Action"], list) else [
        statement["Action"]]
    resources = statement["Resource"] if isinstance(statement["Resource"], list) else [
        statement["Resource"]]
    return any(d["allowed"] and any(matches(a, d["action"]) for a in actions)
               and any(matches(r, d["resource"]) for r in resources) for d in decisions)


def publish(port: int, stream: str, events: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/v1/streams/{stream}/events", json=events,
                      timeout=30)


PAGEVIEWS = [{"user_id": f"u{i}", "url": f"/p/{i}", "duration_ms": i} for i in range(5)]


@pytest.fixture(scope="module")
def ingested(world: World) -> dict[str, Any]:
    """The ingestor, with its role's keys, publishing one batch; then stopped."""
    child = world.start("ingestor", "ingestor")
    try:
        ready = child.ready()
        answer = publish(ready["http_port"], "pageviews", PAGEVIEWS)
        assert answer.status_code in (200, 202), answer.text
        delivered = produce_kafka(ready["kafka_port"], "pageviews", PAGEVIEWS[:2])
        assert child.stop() == 0, child.tail()
    finally:
        child.close()
    return {"answer": answer.json(), "kafka": delivered}


def produce_kafka(port: int, topic: str, events: list[dict[str, Any]]) -> list[str | None]:
    """An idempotent Kafka producer (InitProducerId, then Produce) against the ingestor's
    listener: each record's delivery error, None when acknowledged (durable in the store)."""
    from confluent_kafka import Producer  # why: only this fixture speaks Kafka

    errors: list[str | None] = []
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True,
                         "message.timeout.ms": 30000})
    for event in events:
        producer.produce(topic, json.dumps(event).encode(),
                         on_delivery=lambda err, _msg: errors.append(str(err) if err else None))
    assert producer.flush(40) == 0, "records left undelivered"
    return errors


@pytest.fixture(scope="module")
def administered(world: World) -> dict[str, Any]:
    """The admin API, with its role's keys, creating a source and a sink (a new table)."""
    child = world.start("admin", "admin")
    try:
        ready = child.ready()
        headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{ready['port']}", headers=headers,
                          timeout=60) as api:
            made = api.post("/v1/sources", json={"id": "signups"})
            assert made.status_code == 201, made.text
            sink = api.post("/v1/sources/signups/sinks", json={
                "name": "signups", "table": "web.signups",
                "columns": [{"name": "email", "type": "string", "required": True}]})
            assert sink.status_code == 202, sink.text
            task = sink.json()["task"]
            deadline = time.monotonic() + 60
            while task["state"] not in ("succeeded", "failed"):
                assert time.monotonic() < deadline, task
                time.sleep(0.05)
                task = api.get(f"/v1/tasks/{task['id']}").json()["task"]
            # the error first: pytest cuts a long message, and the error is what tells
            assert task["state"] == "succeeded", (task.get("error"), json.dumps(task),
                                                  child.tail(40))
            # dropping a source asks the queue what is pending for it (the manifest read)
            assert api.post("/v1/sources", json={"id": "scratch"}).status_code == 201
            dropped = api.delete("/v1/sources/scratch")
            assert dropped.status_code == 200, dropped.text
            sources = api.get("/v1/sources").json()["sources"]
            # the schema registry API (Confluent's, HTTP basic auth) rewrites its document
            registered = api.post("/subjects/clicks-value/versions", auth=("me", ADMIN_TOKEN),
                                  json={"schema": json.dumps(CLICK_SCHEMA)},
                                  headers={"content-type": SCHEMA_REGISTRY_CT})
            assert registered.status_code == 200, registered.text
        assert child.stop() == 0, child.tail()
    finally:
        child.close()
    return {"sources": sources}


# --- the checks -------------------------------------------------------------------------

def test_should_give_each_task_role_only_the_module_statements_the_test_knows():
    found = {role: [s["Sid"] for s in policy["Statement"]]
             for role, policy in policies().items()}
    assert found["ingestor"] == ["WriteBatchFiles", "AppendToManifest", "ReadStreamRegistry",
                                 "KeepWriterSchemas", "ConditionalWriteProbe",
                                 "ListControlPrefix", "UseBucketKey", "KafkaProducerIds"]
    # without Kafka, no producer-id counter to touch
    off = Module(TERRAFORM, {**OVERRIDES, "enable_kafka": False}).role_policies(ROLES)
    assert [s["Sid"] for s in off["ingestor"]["Statement"]] == found["ingestor"][:-1]
    for policy in policies().values():
        for statement in policy["Statement"]:
            assert statement["Effect"] == "Allow"
            actions = statement["Action"]
            assert all(a.split(":")[0] in ("s3", "kms") for a in actions), statement
            assert not any(a.endswith("*") for a in actions), statement
            assert all(r.startswith(("arn:aws:s3:::", "arn:aws:kms:")) for r in
                       statement["Resource"]), statement
    # with catalog = "glue" both catalog users get the Glue statement, in this account
    glue = Module(TERRAFORM).role_policies(ROLES)
    for role in ("collector", "admin"):
        (statement,) = [s for s in glue[role]["Statement"] if s["Sid"] == "GlueIcebergCatalog"]
        assert all(f":{ACCOUNT_ID}:" in r for r in statement["Resource"])
    assert not any(s["Sid"] == "GlueIcebergCatalog" for s in glue["ingestor"]["Statement"])


def test_should_start_the_ingestor_with_its_role_and_land_batches_and_manifest_apart(
        world: World, ingested: dict[str, Any]) -> None:
    batches = world.data_keys("ingest/batches/")
    assert batches, "no batch file in the data bucket"
    control = world.client("operator").list_objects_v2(
        Bucket=world.bucket("control_bucket_name"), Prefix="ingest/")
    keys = {o["Key"] for o in control.get("Contents", [])}
    assert "ingest/manifest/queue" in keys
    # the Kafka listener (on, as enable_kafka's default has it) claimed its producer-id block
    assert "ingest/registry/kafka/producer-ids.json" in keys
    assert ingested["kafka"] == [None, None], "Kafka records acknowledged with the role's keys"
    assert not any(k.startswith("ingest/batches/") for k in keys)
    assert not world.data_keys("ingest/manifest/")
    refused = [d for d in world.decisions("ingestor") if not d["allowed"]]
    assert refused == [], f"the ingestor was refused: {refused}"


def test_should_refuse_the_ingestor_deletes_and_the_warehouse(world: World,
                                                              ingested: dict[str, Any]):
    s3 = world.client("ingestor")
    data, control = world.bucket("bucket_name"), world.bucket("control_bucket_name")
    batch = world.data_keys("ingest/batches/")[0]
    assert denied(s3.delete_object, Bucket=data, Key=batch)
    assert denied(s3.get_object, Bucket=data, Key=batch)
    assert denied(s3.delete_object, Bucket=control, Key="ingest/manifest/queue")
    assert denied(s3.put_object, Bucket=control, Key="ingest/registry/registry.json",
                  Body=b"{}")
    assert denied(s3.put_object, Bucket=data, Key="warehouse/web/x.parquet", Body=b"x")
    assert denied(s3.delete_object, Bucket=data, Key="warehouse/web/x.parquet")
    assert batch in world.data_keys("ingest/batches/")


def test_should_let_ingestor_and_collector_use_every_manifest_shard(
        world: World, ingested: dict[str, Any]) -> None:
    """Shard k of the manifest is ``<key>-shard<k>`` and the count is ``<key>.shards``:
    both roles read and rewrite them (the collector fences and acks every shard; either
    grows the count at start), the admin reads them, and neither deletes them. Batch
    files land under ``batches/<xx>/``."""
    from icefloe.manifest.shards import ShardSet

    control = world.bucket("control_bucket_name")
    for role in ("ingestor", "collector"):
        s3 = world.client(role)
        # a valid one-shard record: later tests' processes read it (shard 7 is never read)
        for key, body in (("ingest/manifest/queue-shard7", role.encode()),
                          ("ingest/manifest/queue.shards", ShardSet().encode())):
            s3.put_object(Bucket=control, Key=key, Body=body)
            assert s3.get_object(Bucket=control, Key=key)["Body"].read() == body
            assert denied(s3.delete_object, Bucket=control, Key=key)
    # (the admin's refusals are asserted absent by a later test: only its read here)
    assert world.client("admin").get_object(Bucket=control,
                                            Key="ingest/manifest/queue-shard7")
    assert denied(world.client("ingestor").put_object, Bucket=control,
                  Key="ingest/manifest/other", Body=b"x")
    batches = world.data_keys("ingest/batches/")
    assert all(re.fullmatch(r"ingest/batches/[0-9a-f]{2}/[0-9A-Z]{26}\.ifb", k)
               for k in batches), batches


def test_should_start_the_admin_with_its_role_and_create_a_stream(
        world: World, administered: dict[str, Any]) -> None:
    assert any(s["id"] == "signups" for s in administered["sources"])
    metadata = world.data_keys("warehouse/web/signups/metadata/")
    assert metadata, world.data_keys("warehouse/")
    refused = [d for d in world.decisions("admin") if not d["allowed"]]
    assert refused == [], f"the admin API was refused: {refused}"


def test_should_refuse_the_admin_the_queue_batches_and_deletes(
        world: World, ingested: dict[str, Any], administered: dict[str, Any]) -> None:
    s3 = world.client("admin")
    data, control = world.bucket("bucket_name"), world.bucket("control_bucket_name")
    batch = world.data_keys("ingest/batches/")[0]
    assert denied(s3.put_object, Bucket=control, Key="ingest/manifest/queue", Body=b"x")
    assert denied(s3.delete_object, Bucket=control, Key="ingest/registry/registry.json")
    assert denied(s3.get_object, Bucket=data, Key=batch)
    assert denied(s3.put_object, Bucket=data, Key="ingest/batches/forged.ifb", Body=b"x")
    metadata = world.data_keys("warehouse/")[0]
    assert denied(s3.delete_object, Bucket=data, Key=metadata)


@pytest.mark.parametrize(("role", "sid", "why"), [
    ("ingestor", "ReadStreamRegistry", "the registry is read before the first request"),
    pytest.param("ingestor", "ConditionalWriteProbe", "the start-up probe",
                 marks=pytest.mark.slow),
    pytest.param("ingestor", "AppendToManifest", "no acknowledgement without an append",
                 marks=pytest.mark.slow),
    ("admin", "RewriteStreamRegistry", "the admin API seeds the registry at start"),
    ("ingestor", "KafkaProducerIds", "the Kafka listener claims a producer-id block at start"),
    ("ingestor", "KeepWriterSchemas", "an Avro stream's writer schemas are read at start"),
])
def test_should_not_start_without_a_statement_it_needs(world: World, role: str, sid: str,
                                                       why: str) -> None:
    policy = copy.deepcopy(policies()[role])
    cut = {**policy, "Statement": [s for s in policy["Statement"] if s["Sid"] != sid]}
    assert len(cut["Statement"]) == len(policy["Statement"]) - 1
    user = f"{role}-without-{sid}"
    world.add_user(user, cut)
    child = world.start(user, role)
    try:
        started = _starts_and_publishes(child) if role == "ingestor" else _starts(child)
        assert not started, f"{role} without {sid} worked ({why})"
    finally:
        child.close()
    assert any(not d["allowed"] for d in world.decisions(user)), (
        f"{role} without {sid}: no refused request recorded")


def _starts(child: Child) -> bool:
    try:
        child.ready()
    except AssertionError:
        return False
    return True


def _starts_and_publishes(child: Child) -> bool:
    try:
        ready = child.ready()
    except AssertionError:
        return False
    return publish(ready["http_port"], "pageviews", PAGEVIEWS[:1]).status_code in (200, 202)


@pytest.mark.slow
def test_should_commit_with_the_collector_role_and_refuse_it_the_registry(
        world: World, ingested: dict[str, Any], administered: dict[str, Any]) -> None:
    """ingest → manifest → Iceberg commit, the collector on its role's keys (Spark)."""
    earlier = len(world.decisions("collector"))  # other tests' deliberate refusals
    child = world.start("collector", "collector")
    try:
        child.ready()
        s3 = world.client("operator")
        control = world.bucket("control_bucket_name")

        def acked() -> bool:
            body = s3.get_object(Bucket=control, Key="ingest/manifest/queue")["Body"].read()
            return _acked(body) >= 0  # sequences start at 0

        wait_for(acked, 180, "the collector to commit and ack the first entry")
        assert child.stop() == 0, child.tail()
    finally:
        child.close()
    refused = [d for d in world.decisions("collector")[earlier:] if not d["allowed"]]
    assert refused == [], f"the collector was refused: {refused}"
    s3c = world.client("collector")
    assert denied(s3c.put_object, Bucket=control, Key="ingest/registry/registry.json",
                  Body=b"{}")
    assert denied(s3c.put_object, Bucket=control, Key="ingest/_icefloe/probe/x", Body=b"x")
    assert denied(s3c.put_object, Bucket=control, Key="ingest/registry/schemas.json",
                  Body=b"{}")
    _check_every_statement_used(world, ("collector",))


def test_should_use_every_ingestor_and_admin_statement(
        world: World, ingested: dict[str, Any], administered: dict[str, Any]) -> None:
    """Removing any of them takes away something these runs did (or it is explained in
    NOT_EXERCISED); the collector's are checked after its (slow, Spark) run."""
    _check_every_statement_used(world, ("ingestor", "admin"))


def _acked(body: bytes) -> int:
    from icefloe.manifest.model import Manifest

    return Manifest.decode(body).consumer.acked_through


def _check_every_statement_used(world: World, roles: tuple[str, ...]) -> None:
    unused = set()
    for role in roles:
        policy = policies()[role]
        decisions = world.decisions(role)
        for statement in policy["Statement"]:
            if not statement_used(statement, decisions):
                unused.add((role, statement["Sid"]))
    explained = {key for key in NOT_EXERCISED if key[0] in roles}
    assert unused == explained, (
        f"unused but not explained: {sorted(unused - explained)}; explained but used "
        f"after all: {sorted(explained - unused)}")


# --- the load balancer ---------------------------------------------------------------------

def test_should_route_only_the_ingest_paths_and_service_through_the_load_balancer():
    """lb.tf, evaluated: each listener answers 404 by default and forwards only the ingest
    routes the ingestor really serves; /metrics, health and reflection stay inside."""
    import fnmatch

    from icefloe.v1 import ingest_pb2
    from ingestor.http.steps import ingest_target

    tf = module()
    resources = tf.typed_blocks("resource")
    # only the routing is evaluated (ARNs and certificates are AWS's to know)
    listeners = {name: {"default_action": tf.value(body["default_action"])}
                 for (rtype, name), body in resources.items() if rtype == "aws_lb_listener"
                 and not name.startswith("otlp_")}  # OTLP's (enable_otlp): test_deploy.py
    assert set(listeners) == {"https", "grpc", "kafka"}
    # the Kafka NLB (TCP: no paths to route) forwards everything on 9092 to the Kafka port
    (kafka,) = listeners.pop("kafka")["default_action"]
    assert kafka["type"] == "forward"
    assert kafka["target_group_arn"].endswith("targetgroup/kafka"), kafka
    for name, listener in listeners.items():
        (default,) = listener["default_action"]
        assert default["type"] == "fixed-response", f"listener {name} forwards by default"
        assert default["fixed_response"][0]["status_code"] == "404"
    rules: dict[str, list[str]] = {}
    for (rtype, _name), body in resources.items():
        if rtype != "aws_lb_listener_rule" or "aws_lb_listener.otlp_" in body["listener_arn"]:
            continue  # OTLP's routes (enable_otlp) are checked by test_deploy.py
        rule = {key: tf.value(body[key]) for key in ("action", "condition")}
        (action,) = rule["action"]
        assert action["type"] == "forward"
        listener = re.fullmatch(r"\$\{aws_lb_listener\.(\w+)\.arn\}", body["listener_arn"])
        assert listener, body["listener_arn"]
        target = {"https": "http", "grpc": "grpc"}[listener.group(1)]
        assert action["target_group_arn"].endswith(f"targetgroup/{target}"), action
        (condition,) = rule["condition"]
        assert set(condition) == {"path_pattern"}, condition
        rules.setdefault(listener.group(1), []).extend(condition["path_pattern"][0]["values"])

    def routed(listener: str, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, p) for p in rules[listener])

    ingest_paths = ("/v1/streams/pageviews/events", "/ingest/pageviews",
                    "/collect/web/pageviews", "/collect/web/pageviews/batch")
    for path in ingest_paths:
        assert ingest_target(path) is not None, f"{path} is no ingest route (any more)"
        assert routed("https", path), path
    for pattern in rules["https"]:
        assert any(fnmatch.fnmatchcase(p, pattern) for p in ingest_paths), (
            f"{pattern} forwards no ingest route")
    for path in ("/metrics", "/healthz", "/readyz", "/openapi.json", "/", "/v1/streams"):
        assert not routed("https", path), f"{path} is reachable through the load balancer"
    service = ingest_pb2.DESCRIPTOR.services_by_name["Ingest"]
    for method in service.methods:
        assert routed("grpc", f"/{service.full_name}/{method.name}"), method.name
    for path in ("/grpc.health.v1.Health/Check",
                 "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                 "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"):
        assert not routed("grpc", path), f"{path} is reachable through the load balancer"
