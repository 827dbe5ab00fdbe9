"""icefloe's schema registry (the Confluent Schema Registry API's core on the admin port),
served by the real admin process on a free port and called by confluent-kafka's own
registry client and serializers: register, look up, version, check compatibility, serialize
and read back Avro, Protobuf (a generated message class, with an import resolved as a
reference) and JSON Schema records; precise Confluent-shaped refusals; persistence across a
restart; two admin processes racing on one moto S3 bucket; another vendor's client."""

from __future__ import annotations

import base64
import importlib
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from icefloe.config import Config
from icefloe.tokens import hash_token
from tests.admin_support import admin_server
from tests.collector_support import CLICKS, collector_config

pytest.importorskip("confluent_kafka.schema_registry")

from confluent_kafka.schema_registry import (
    Schema,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
)
from confluent_kafka.serialization import MessageField, SerializationContext

TOKEN = "ifl_admin-registry-test-token"
CT = "application/vnd.schemaregistry.v1+json"
USER = {"name": "string", "n": "int"}
AVRO_V1 = ('{"type": "record", "name": "User", "namespace": "acme", "fields": ['
           '{"name": "name", "type": "string"}, {"name": "n", "type": "int"}]}')


@dataclass
class Server:
    url: str
    config: Config
    http: httpx.Client

    def client(self, token: str = TOKEN) -> SchemaRegistryClient:
        return SchemaRegistryClient({"url": self.url, "basic.auth.user.info": f"me:{token}",
                                     "max.retries": 0})


def config_for(root: Path, store: dict[str, Any] | None = None) -> Config:
    root.mkdir(parents=True, exist_ok=True)
    base = collector_config(root, (CLICKS,), store=store)
    return msgspec.structs.replace(base, admin=msgspec.structs.replace(
        base.admin, port=0, tokens=(hash_token(TOKEN, log2_n=10),)))


def serve(config: Config) -> Iterator[Server]:
    """The real admin process's server (``serve_admin``) on a free port in a thread."""
    with admin_server(config) as url, \
            httpx.Client(base_url=url, auth=("me", TOKEN), timeout=30) as http:
        yield Server(url, config, http)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    yield from serve(config_for(tmp_path))


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return server.http.post(path, json=body, headers={"content-type": CT})


def refused(response: httpx.Response, status: int, code: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(CT)
    body = response.json()
    assert set(body) == {"error_code", "message"}, body
    assert body["error_code"] == code, body
    return str(body["message"])


# -- the registry client -----------------------------------------------------------------


def test_client_registers_gets_looks_up_and_checks(server: Server) -> None:
    client = server.client()
    first = client.register_schema("users-value", Schema(AVRO_V1, "AVRO"))
    # the same schema with other whitespace is the same schema: same id, no new version
    again = client.register_schema("users-value", Schema(
        AVRO_V1.replace(", ", ",").replace(": ", ":"), "AVRO"))
    assert again == first
    v2 = ('{"type":"record","name":"User","namespace":"acme","fields":[{"name":"name",'
          '"type":"string"},{"name":"n","type":"long"},{"name":"email","type":["null",'
          '"string"],"default":null}]}')
    assert client.test_compatibility("users-value", Schema(v2, "AVRO"))
    second = client.register_schema("users-value", Schema(v2, "AVRO"))
    assert second == first + 1
    assert client.get_subjects() == ["users-value"]
    assert client.get_versions("users-value") == [1, 2]
    latest = client.get_latest_version("users-value")
    assert (latest.schema_id, latest.version) == (second, 2)
    assert client.get_version("users-value", 1).schema_id == first
    found = client.lookup_schema("users-value", Schema(AVRO_V1, "AVRO"))
    assert (found.schema_id, found.version) == (first, 1)
    assert client.get_schema(first).schema_str is not None
    # the same schema under another subject keeps its global id
    assert client.register_schema("other-value", Schema(AVRO_V1, "AVRO")) == first
    assert sorted(server.http.get(f"/schemas/ids/{first}/versions").json(),
                  key=lambda v: v["subject"]) == [{"subject": "other-value", "version": 1},
                                                  {"subject": "users-value", "version": 1}]
    assert server.http.get("/schemas/types").json() == ["AVRO", "JSON", "PROTOBUF"]
    raw = server.http.get("/subjects/users-value/versions/1/schema")
    assert raw.headers["content-type"].startswith(CT)
    assert raw.json()["name"] == "User"
    # a field removed without default on the reader side is fine backward; an added
    # required field is not, and the refusal names the field and the rule
    bad = ('{"type":"record","name":"User","namespace":"acme","fields":[{"name":"name",'
           '"type":"string"},{"name":"n","type":"long"},{"name":"age","type":"int"}]}')
    assert not client.test_compatibility("users-value", Schema(bad, "AVRO"))
    with pytest.raises(SchemaRegistryError) as info:
        client.register_schema("users-value", Schema(bad, "AVRO"))
    assert info.value.http_status_code == 409
    assert info.value.error_code == 409
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in info.value.error_message
    assert "age" in info.value.error_message
    assert client.get_versions("users-value") == [1, 2]  # nothing stored
    verbose = post(server, "/compatibility/subjects/users-value/versions/latest?verbose=true",
                   {"schema": bad})
    assert verbose.json()["is_compatible"] is False
    assert any("age" in m for m in verbose.json()["messages"])
    metrics = server.http.get("/metrics").text
    assert 'icefloe_schema_registry_requests_total{operation="register",status="409"} 1.0' \
        in metrics


# -- serializers -------------------------------------------------------------------------


def test_avro_serializer_auto_registers_and_deserializer_reads_back(server: Server) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

    client = server.client()
    serialize = AvroSerializer(client, AVRO_V1)
    ctx = SerializationContext("users", MessageField.VALUE)
    data = serialize({"name": "ada", "n": 7}, ctx)
    schema_id = int.from_bytes(data[1:5], "big")
    assert data[0] == 0
    assert schema_id == client.get_latest_version("users-value").schema_id
    # a fresh client (no cache) fetches the writer schema by id from icefloe
    assert AvroDeserializer(server.client())(data, ctx) == {"name": "ada", "n": 7}


PROTO_BASE = """syntax = "proto3";
package icefloe.regtest;
message Money { string currency = 1; int64 units = 2; }
"""
PROTO_ORDER = """syntax = "proto3";
package icefloe.regtest;
import "icefloe_regtest/money.proto";
import "google/protobuf/timestamp.proto";
message OrderPlaced {
  string order_id = 1;
  Money total = 2;
  repeated string items = 3;
  google.protobuf.Timestamp at = 4;
}
"""


@pytest.fixture(scope="module")
def order_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A message class generated by grpcio-tools from a .proto that imports another."""
    from grpc_tools import protoc

    root = tmp_path_factory.mktemp("proto")
    (root / "icefloe_regtest").mkdir()
    (root / "icefloe_regtest" / "money.proto").write_text(PROTO_BASE)
    (root / "icefloe_regtest" / "order.proto").write_text(PROTO_ORDER)
    (root / "icefloe_regtest" / "__init__.py").write_text("")
    include = Path(protoc.__file__).parent / "_proto"
    assert protoc.main(["protoc", f"-I{root}", f"-I{include}", f"--python_out={root}",
                        "icefloe_regtest/money.proto", "icefloe_regtest/order.proto"]) == 0
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module("icefloe_regtest.order_pb2")
    finally:
        sys.path.remove(str(root))


def test_protobuf_serializer_registers_references_and_reads_back(
        server: Server, order_module: Any) -> None:
    from confluent_kafka.schema_registry.protobuf import (
        ProtobufDeserializer,
        ProtobufSerializer,
    )

    client = server.client()
    serialize = ProtobufSerializer(order_module.OrderPlaced, client,
                                   {"use.deprecated.format": False})
    ctx = SerializationContext("orders", MessageField.VALUE)
    message = order_module.OrderPlaced(order_id="o-1", items=["a", "b"])
    message.total.currency, message.total.units = "EUR", 12
    message.at.seconds = 1_700_000_000
    data = serialize(message, ctx)
    # the import was registered as its own subject and referenced by the order's schema
    assert "icefloe_regtest/money.proto" in client.get_subjects()
    latest = client.get_latest_version("orders-value")
    assert latest.schema.schema_type == "PROTOBUF"
    assert [r.name for r in latest.schema.references] == ["icefloe_regtest/money.proto"]
    read = ProtobufDeserializer(order_module.OrderPlaced, {"use.deprecated.format": False},
                                schema_registry_client=server.client())
    assert read(data, ctx) == message
    # a field number reused with another type is refused, naming the field
    reused = PROTO_ORDER.replace("repeated string items = 3;", "int64 items = 3;")
    with pytest.raises(SchemaRegistryError) as info:
        client.register_schema("orders-value", Schema(reused, "PROTOBUF", [SchemaReference(
            "icefloe_regtest/money.proto", "icefloe_regtest/money.proto", 1)]))
    assert info.value.http_status_code == 409
    assert "icefloe.regtest.OrderPlaced.items (number 3)" in info.value.error_message
    assert "label changed from repeated to optional" in info.value.error_message or \
        "type changed" in info.value.error_message
    # a removed field is compatible; .proto text and the client's base64 form both parse
    removed = PROTO_ORDER.replace("  repeated string items = 3;\n", "")
    assert client.register_schema("orders-value", Schema(removed, "PROTOBUF", [
        SchemaReference("icefloe_regtest/money.proto", "icefloe_regtest/money.proto", 1)]))
    serialized = server.http.get(f"/schemas/ids/{latest.schema_id}?format=serialized")
    assert base64.b64decode(serialized.json()["schema"])  # a descriptor, as clients ask


def test_json_serializer_and_its_checks(server: Server) -> None:
    from confluent_kafka.schema_registry.json_schema import (
        JSONDeserializer,
        JSONSerializer,
    )

    schema = ('{"type": "object", "properties": {"name": {"type": "string"}, "n": '
              '{"type": "integer"}}, "required": ["name"]}')
    client = server.client()
    ctx = SerializationContext("people", MessageField.VALUE)
    data = JSONSerializer(schema, client)({"name": "ada", "n": 3}, ctx)
    assert JSONDeserializer(schema, schema_registry_client=server.client())(data, ctx) == \
        {"name": "ada", "n": 3}
    assert data[0] == 0
    assert int.from_bytes(data[1:5], "big") == \
        client.get_latest_version("people-value").schema_id
    changes = {
        "type changed": ('{"type": "object", "properties": {"name": {"type": "string"}, '
                         '"n": {"type": "string"}}, "required": ["name"]}', "properties/n"),
        "made required": ('{"type": "object", "properties": {"name": {"type": "string"}, '
                          '"n": {"type": "integer"}}, "required": ["name", "n"]}',
                          "properties/n: made required"),
        "narrowed": ('{"type": "object", "properties": {"name": {"type": "string"}, "n": '
                     '{"type": "integer"}}, "required": ["name"], '
                     '"additionalProperties": false}', "additionalProperties narrowed"),
        "unchecked keyword": ('{"type": "object", "properties": {"name": {"type": "string"}, '
                              '"n": {"type": "integer"}}, "required": ["name"], "anyOf": '
                              '[{"required": ["n"]}]}', "keyword 'anyOf' is not checked"),
    }
    for what, (text, named) in changes.items():
        message = refused(post(server, "/subjects/people-value/versions",
                               {"schema": text, "schemaType": "JSON"}), 409, 409)
        assert named in message, (what, message)
    assert client.get_versions("people-value") == [1]


# -- refusals ----------------------------------------------------------------------------


def test_refusals_have_confluents_shape_and_codes(server: Server) -> None:
    assert "Invalid schema" in refused(post(server, "/subjects/s/versions",
                                            {"schema": '{"type": "recrd"}'}), 422, 42201)
    refused(post(server, "/subjects/s/versions", {"schema": "message M { int32 a = 1 }",
                                                  "schemaType": "PROTOBUF"}), 422, 42201)
    refused(post(server, "/subjects/s/versions", {"schema": '{"type": 3}',
                                                  "schemaType": "JSON"}), 422, 42201)
    refused(post(server, "/subjects/s/versions", {"schema": "{}", "schemaType": "XML"}),
            422, 42201)
    refused(post(server, "/subjects/s/versions", {"schema": '"int"', "ruleSet": {
        "domainRules": []}}), 422, 42201)
    refused(server.http.get("/schemas/ids/999"), 404, 40403)
    refused(server.http.get("/schemas/ids/abc"), 404, 40403)
    refused(server.http.get("/subjects/nope/versions"), 404, 40401)
    assert post(server, "/subjects/s/versions", {"schema": '"int"'}).json() == {"id": 1}
    refused(server.http.get("/subjects/s/versions/7"), 404, 40402)
    refused(server.http.get("/subjects/s/versions/zero"), 422, 42202)
    refused(post(server, "/subjects/s", {"schema": '"long"'}), 404, 40403)
    refused(post(server, "/subjects/nope", {"schema": '"int"'}), 404, 40401)
    refused(server.http.put("/config", json={"compatibility": "SIDEWAYS"}), 422, 42203)
    refused(server.http.get("/config/s"), 404, 40408)
    assert "no such endpoint: GET /mode" in refused(server.http.get("/mode"), 404, 404)
    refused(server.http.patch("/subjects/s/versions"), 405, 405)
    # auth: no credentials, a wrong password, and a garbled header are all 401
    anonymous = httpx.get(f"{server.url}/subjects")
    refused(anonymous, 401, 401)
    assert anonymous.headers["www-authenticate"].startswith("Basic")
    refused(httpx.get(f"{server.url}/subjects", auth=("me", "ifl_wrong")), 401, 401)
    refused(httpx.get(f"{server.url}/subjects", headers={"authorization": "Basic !!"}),
            401, 401)
    with pytest.raises(SchemaRegistryError) as info:
        server.client("ifl_wrong").get_subjects()
    assert info.value.http_status_code == 401
    # a bearer admin token works as well
    assert httpx.get(f"{server.url}/subjects", headers={
        "authorization": f"Bearer {TOKEN}"}).json() == ["s"]


def test_levels_and_deletes(server: Server) -> None:
    v1 = '{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}'
    v2 = ('{"type":"record","name":"R","fields":[{"name":"a","type":"int"},'
          '{"name":"b","type":"string","default":"x"}]}')
    v3 = '{"type":"record","name":"R","fields":[{"name":"b","type":"string"}]}'
    assert server.http.get("/config").json() == {"compatibilityLevel": "BACKWARD"}
    assert server.http.put("/config/r", json={"compatibility": "FULL_TRANSITIVE"}).json() == \
        {"compatibility": "FULL_TRANSITIVE"}
    assert server.http.get("/config/r").json() == {"compatibilityLevel": "FULL_TRANSITIVE"}
    for text in (v1, v2):
        assert post(server, "/subjects/r/versions", {"schema": text}).status_code == 200
    # v3 drops `a` (no default): the old schemas cannot read its data
    message = refused(post(server, "/subjects/r/versions", {"schema": v3}), 409, 409)
    assert "FULL_TRANSITIVE" in message
    assert "/fields/0" in message
    assert server.http.delete("/config/r").json() == {"compatibilityLevel": "FULL_TRANSITIVE"}
    assert server.http.get("/config/r?defaultToGlobal=true").json() == {
        "compatibilityLevel": "BACKWARD"}
    assert server.http.put("/config", json={"compatibility": "NONE"}).status_code == 200
    assert post(server, "/subjects/r/versions", {"schema": v3}).json()["id"] == 3
    # soft delete hides a version; permanent only after soft
    refused(server.http.delete("/subjects/r/versions/3?permanent=true"), 404, 40407)
    assert server.http.delete("/subjects/r/versions/3").json() == 3
    refused(server.http.delete("/subjects/r/versions/3"), 404, 40406)
    assert server.http.get("/subjects/r/versions").json() == [1, 2]
    assert server.http.get("/subjects/r/versions?deleted=true").json() == [1, 2, 3]
    assert server.http.get("/subjects/r/versions/latest").json()["version"] == 2
    assert server.http.delete("/subjects/r/versions/3?permanent=true").json() == 3
    refused(server.http.delete("/subjects/r?permanent=true"), 404, 40405)
    assert server.http.delete("/subjects/r").json() == [1, 2]
    refused(server.http.delete("/subjects/r"), 404, 40404)
    assert server.http.get("/subjects").json() == []
    assert server.http.get("/subjects?deleted=true").json() == ["r"]
    assert server.http.delete("/subjects/r?permanent=true").json() == [1, 2]
    # ids stay with their schemas; a re-registration after all that gets the old id and a
    # version number never used before
    assert server.http.get("/schemas/ids/3").json()["schema"] == v3
    assert post(server, "/subjects/r/versions", {"schema": v1}).json() == {"id": 1}
    assert server.http.get("/subjects/r/versions").json() == [4]


def test_persists_across_a_restart(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    for first in serve(config):
        assert post(first, "/subjects/a/versions", {"schema": '"string"'}).json() == {"id": 1}
        assert first.http.put("/config/a", json={"compatibility": "NONE"}).status_code == 200
    for second in serve(config):
        assert second.http.get("/subjects/a/versions/1").json()["schema"] == '"string"'
        assert second.http.get("/config/a").json() == {"compatibilityLevel": "NONE"}
        assert post(second, "/subjects/b/versions", {"schema": '"long"'}).json() == {"id": 2}


@pytest.mark.s3
def test_two_admin_processes_race_on_one_s3_bucket(tmp_path: Path, s3_bucket: Any) -> None:
    """Two servers on one store: every registration lands once, ids never collide, the
    same schema from both gets one id, and nothing either wrote is replaced."""
    store = {"url": s3_bucket.url, "endpoint_url": s3_bucket.endpoint_url}
    left = serve(config_for(tmp_path / "left", store))
    right = serve(config_for(tmp_path / "right", store))
    a, b = next(left), next(right)
    try:
        def register(job: tuple[Server, str, str]) -> int:
            server, subject, schema = job
            response = post(server, f"/subjects/{subject}/versions", {"schema": schema})
            assert response.status_code == 200, response.text
            return int(response.json()["id"])
        jobs = [(a if i % 2 else b, f"s{i}", f'{{"type":"fixed","name":"F{i}","size":{i + 1}}}')
                for i in range(12)]
        same = '{"type":"enum","name":"E","symbols":["X"]}'
        jobs += [(a, "shared-a", same), (b, "shared-b", same)]
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(register, jobs))
        assert ids[-1] == ids[-2]  # one schema, one id, whoever won
        assert sorted(set(ids)) == list(range(1, 14))
        for server in (a, b):
            assert len(server.http.get("/subjects").json()) == 14
            for (_, subject, schema), schema_id in zip(jobs, ids, strict=True):
                got = server.http.get(f"/subjects/{subject}/versions/1").json()
                assert (got["id"], got["schema"]) == (schema_id, schema)
    finally:
        for gen in (left, right):
            with pytest.raises(StopIteration):
                next(gen)


def test_another_vendors_client_and_serializer(server: Server) -> None:
    """python-schema-registry-client (marcosschroh), an independent implementation of the
    same API: register, look up, check, levels, and its Avro message serializer."""
    registry = pytest.importorskip("schema_registry.client")
    serializers = pytest.importorskip("schema_registry.serializers")

    client = registry.SchemaRegistryClient(server.url, auth=httpx.BasicAuth("me", TOKEN))
    schema_id = client.register("vendor-value", AVRO_V1)
    assert client.register("vendor-value", AVRO_V1) == schema_id
    assert client.get_by_id(schema_id).raw_schema["name"] == "User"
    found = client.check_version("vendor-value", AVRO_V1)
    assert (found.schema_id, found.version) == (schema_id, 1)
    assert client.get_schema("vendor-value").version == 1
    assert client.update_compatibility("FULL", "vendor-value")
    assert client.get_compatibility("vendor-value") == "FULL"
    widened = AVRO_V1.replace('"type": "int"', '"type": "long"')
    assert client.test_compatibility("vendor-value", widened) is False  # FULL: long→int fails
    serializer = serializers.AvroMessageSerializer(client)
    data = serializer.encode_record_with_schema("vendor-value", registry.schema.AvroSchema(
        AVRO_V1), {"name": "ada", "n": 1})
    assert int.from_bytes(data[1:5], "big") == schema_id
    assert serializer.decode_message(data) == {"name": "ada", "n": 1}
