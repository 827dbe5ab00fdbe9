"""``[store] control_url``: batch files in one bucket, everything rewritten in place in another.

Why it exists: the manifest is rewritten on every CAS; in a versioned bucket that piles up
noncurrent versions of one key until S3 answers 503 SlowDown (deploy/README.md). The data
bucket keeps versioning for batch files; the control bucket holds the manifest, registry,
staging state and the probe object. These tests run the real pieces over two buckets of the
moto S3 server and look where each object landed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import boto3
import pytest
from conftest import S3Target

from icefloe.config import load_config
from icefloe.errors import ConfigError
from icefloe.manifest.consumer import load
from icefloe.manifest.publish import publish_batch
from icefloe.registry import RegistryStore
from icefloe.store import open_async_store, options_for
from icefloe.store.probe import probe_conditional_writes
from tests.collector_support import CLICKS


def keys(target: S3Target) -> set[str]:
    client = boto3.client("s3", endpoint_url=target.endpoint_url, region_name="us-east-1")
    listed = client.list_objects_v2(Bucket=target.bucket, Prefix=target.prefix)
    return {o["Key"][len(target.prefix):] for o in listed.get("Contents", [])}


def two_buckets(moto_server: str, tmp_path: Path) -> tuple[S3Target, S3Target, Path]:
    client = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
    targets = []
    for name in ("split-data", "split-control"):
        bucket = f"{name}-{tmp_path.name.lower().replace('_', '-')[-20:]}"
        client.create_bucket(Bucket=bucket)
        targets.append(S3Target(f"s3://{bucket}/ingest", moto_server, bucket, "ingest/"))
    data, control = targets
    config = tmp_path / "icefloe.toml"
    config.write_text(f'[store]\nurl = "{data.url}"\ncontrol_url = "{control.url}"\n'
                      f'endpoint_url = "{moto_server}"\nregion = "us-east-1"\n')
    return data, control, config


def test_should_keep_batch_files_apart_from_manifest_registry_staging_and_probe(
        moto_server: str, tmp_path: Path) -> None:
    from collector.gc import collect_garbage
    from collector.staging import StagingArea
    from icefloe.manifest.producer import ManifestProducer

    data, control, path = two_buckets(moto_server, tmp_path)
    config = load_config(path)
    assert config.store.control_url == control.url

    async def run() -> int:
        store = open_async_store(config.store.url, options_for(
            config.store.endpoint_url, config.store.region),
            control_url=config.store.control_url)
        try:
            await probe_conditional_writes(store)
            await RegistryStore(store, config.admin.registry_key).seed((CLICKS,), None)
            producer = ManifestProducer(store, config.manifest.build())
            sequence = await publish_batch(store, producer, b"batch-bytes", record_count=1,
                                           streams=["clicks"])
            await StagingArea(store).claim("web.clicks", epoch=1, create=True)
            loaded = await load(store, config.manifest.key)
            assert [e.sequence for e in loaded.manifest.entries] == [sequence]
            gc = await collect_garbage(store, config.manifest.key, grace_s=0.0)
            assert gc.listed == 1
            assert gc.referenced == 1
            return sequence or 0
        finally:
            await store.close()

    asyncio.run(run())
    in_data, in_control = keys(data), keys(control)
    assert {k.split("/")[0] for k in in_data} == {"batches"}, in_data
    assert {"manifest/queue", "registry/registry.json",
            "staging/web.clicks/state.json"} <= in_control, in_control
    assert not any(k.startswith("batches/") for k in in_control)


def test_should_keep_everything_under_url_without_control_url(s3_bucket: S3Target) -> None:
    async def run() -> None:
        store = open_async_store(s3_bucket.url, options_for(s3_bucket.endpoint_url, None),
                                 control_url=s3_bucket.url)
        try:
            await RegistryStore(store).seed((CLICKS,), None)
        finally:
            await store.close()

    asyncio.run(run())
    assert "registry/registry.json" in keys(s3_bucket)


def test_should_refuse_a_control_url_inside_the_batch_files(tmp_path: Path) -> None:
    path = tmp_path / "icefloe.toml"
    path.write_text('[store]\nurl = "s3://b/ingest"\ncontrol_url = "s3://b/ingest/batches/x"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "store.control_url" in str(info.value)
    assert "store.url" in str(info.value)


def test_should_take_the_control_url_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "icefloe.toml"
    path.write_text("")
    config = load_config(path, env={"ICEFLOE_STORE_CONTROL_URL": "s3://ctl/ingest"})
    assert config.store.control_url == "s3://ctl/ingest"
    relative = load_config(path, env={"ICEFLOE_STORE_CONTROL_URL": "file://ctl"})
    assert relative.store.control_url == (tmp_path / "ctl").as_uri()
