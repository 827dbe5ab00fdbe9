# Least-privilege roles. Two buckets: the data bucket (versioned) holds batch files and the
# Iceberg warehouse; the control bucket (unversioned, s3.tf says why) holds what is rewritten
# by compare-and-swap: the manifest queue, the stream registry, staging state and the
# start-up probe object. Ingestors write batch files, append to the manifest and read the
# registry: they cannot delete a batch file, read the warehouse or reach the catalog. The
# collector reads, writes and deletes under the store prefix of both buckets (acks, dequeues,
# batch-file GC, staging) and the warehouse (Iceberg data, metadata, maintenance), and uses
# the catalog. The admin API rewrites the registry, reads the manifest and staging state,
# creates and evolves tables (warehouse metadata, catalog) and deletes nothing.

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    sid     = "EcsTasksOfThisAccount"
    effect  = "Allow"
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["arn:${local.partition}:ecs:${var.aws_region}:${local.account_id}:*"]
    }
  }
}

# --- task execution role: what ECS itself needs to start the containers ------------------------

resource "aws_iam_role" "execution" {
  name_prefix        = "${var.name}-exec-"
  description        = "ECS task execution role of ${var.name}: pull the image, write logs, read the task secrets"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

data "aws_iam_policy_document" "execution" {
  statement {
    sid       = "EcrLogin"
    effect    = "Allow"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"] # this action has no resource-level permissions
  }
  statement {
    sid    = "PullIcefloeImage"
    effect = "Allow"
    actions = [
      "ecr:BatchCheckLayerAvailability",
      "ecr:BatchGetImage",
      "ecr:GetDownloadUrlForLayer",
    ]
    resources = [aws_ecr_repository.icefloe.arn]
  }
  statement {
    sid     = "WriteTaskLogs"
    effect  = "Allow"
    actions = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = [
      "${aws_cloudwatch_log_group.ingestor.arn}:*",
      "${aws_cloudwatch_log_group.collector.arn}:*",
      "${aws_cloudwatch_log_group.admin.arn}:*",
    ]
  }
  statement {
    sid     = "ReadTaskSecrets"
    effect  = "Allow"
    actions = ["secretsmanager:GetSecretValue"]
    resources = concat(
      [aws_secretsmanager_secret.config.arn],
      aws_secretsmanager_secret.catalog_uri[*].arn,
    )
  }
  statement {
    sid       = "DecryptWithIcefloeKey"
    effect    = "Allow"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.icefloe.arn]
  }
}

resource "aws_iam_role_policy" "execution" {
  name   = "pull-log-secrets"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution.json
}

# --- ingestor task role ---------------------------------------------------------------

resource "aws_iam_role" "ingestor" {
  name_prefix        = "${var.name}-ingestor-"
  description        = "icefloe ingestor tasks: write batch files, append to the manifest queue, read the registry"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

data "aws_iam_policy_document" "ingestor" {
  statement {
    # batches/<xx>/<ULID>.ifb: 256 key prefixes for S3's per-prefix request rates
    sid       = "WriteBatchFiles"
    effect    = "Allow"
    actions   = ["s3:PutObject"]
    resources = ["${local.bucket_arn}/${local.batch_keys}"]
  }
  statement {
    # every manifest shard (shard 0 is the key itself, shard k is "<key>-shard<k>") and
    # the shard-count record, which an ingestor asking for more shards grows at start
    sid    = "AppendToManifest"
    effect = "Allow"
    actions = ["s3:GetObject", "s3:PutObject"]
    resources = [
      "${local.control_bucket_arn}/${local.manifest_key}",
      "${local.control_bucket_arn}/${local.manifest_key}-shard*",
      "${local.control_bucket_arn}/${local.manifest_key}.shards",
    ]
  }
  statement {
    # read at start (before the first request) and polled: streams added by the admin API
    sid       = "ReadStreamRegistry"
    effect    = "Allow"
    actions   = ["s3:GetObject"]
    resources = ["${local.control_bucket_arn}/${local.registry_key}"]
  }
  statement {
    # the schema registry document (ingestor.writer_schemas): read at start when a stream
    # is Avro or follows a subject, and extended by compare-and-swap with the writer schema
    # of an Avro stream's single-object records; never deleted
    sid       = "KeepWriterSchemas"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = ["${local.control_bucket_arn}/${local.schema_registry_key}"]
  }
  statement {
    # the start-up probe writes one small object and removes it again; nothing else is
    # deletable by an ingestor
    sid       = "ConditionalWriteProbe"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${local.control_bucket_arn}/${local.probe_keys}"]
  }
  # the Kafka listener claims a block of producer ids by compare-and-swap at start (and
  # when a block runs out); never deleted: ids would start again and collide
  dynamic "statement" {
    for_each = var.enable_kafka ? [1] : []
    content {
      sid       = "KafkaProducerIds"
      effect    = "Allow"
      actions   = ["s3:GetObject", "s3:PutObject"]
      resources = ["${local.control_bucket_arn}/${local.kafka_producer_ids_key}"]
    }
  }
  statement {
    # without ListBucket S3 answers 403 instead of 404 for a manifest or registry that does
    # not exist yet
    sid       = "ListControlPrefix"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [local.control_bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.batch_prefix}/*"]
    }
  }
  statement {
    sid       = "UseBucketKey"
    effect    = "Allow"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.icefloe.arn]
  }
}

resource "aws_iam_role_policy" "ingestor" {
  name   = "icefloe-ingestor"
  role   = aws_iam_role.ingestor.id
  policy = data.aws_iam_policy_document.ingestor.json
}

# --- collector task role ---------------------------------------------------------------

resource "aws_iam_role" "collector" {
  name_prefix        = "${var.name}-collector-"
  description        = "icefloe collector task: consume the manifest queue, commit into Iceberg, collect garbage"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

data "aws_iam_policy_document" "collector" {
  statement {
    sid    = "StoreAndWarehouseObjects"
    effect = "Allow"
    actions = [
      "s3:GetObject",
      "s3:PutObject",
      "s3:DeleteObject",
      "s3:AbortMultipartUpload",
    ]
    resources = [
      "${local.bucket_arn}/${var.batch_prefix}/*",
      "${local.bucket_arn}/${var.warehouse_prefix}/*",
    ]
  }
  statement {
    sid       = "ListStoreAndWarehouse"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.batch_prefix}/*", "${var.warehouse_prefix}/*"]
    }
  }
  statement {
    # lease, fencing, acks and dequeues: compare-and-swap rewrites of every manifest
    # shard, and the shard-count record (read each run; grown at start if asked)
    sid    = "ConsumeManifest"
    effect = "Allow"
    actions = ["s3:GetObject", "s3:PutObject"]
    resources = [
      "${local.control_bucket_arn}/${local.manifest_key}",
      "${local.control_bucket_arn}/${local.manifest_key}-shard*",
      "${local.control_bucket_arn}/${local.manifest_key}.shards",
    ]
  }
  statement {
    # the catalog-wide version each run claims before its first commit, and the epoch a
    # takeover stamps on it (icefloe.catalog_version: a compare-and-swap counter)
    sid       = "ClaimCatalogVersion"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = ["${local.control_bucket_arn}/${local.catalog_version_key}"]
  }
  statement {
    # where this collector answers `icefloe run` (icefloe.collector_address): read, then
    # rewritten by compare-and-swap when it takes the lease, so a newer holder's stays
    sid       = "PublishCollectorAddress"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = ["${local.control_bucket_arn}/${local.collector_address_key}"]
  }
  statement {
    # the dedup journal (collector.journal): the event ids each commit accepted, per table,
    # read back at start; old records are swept
    sid       = "DedupJournal"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${local.control_bucket_arn}/${local.dedup_keys}"]
  }
  statement {
    # staged rows of sinks with commit conditions: state documents and Parquet files
    sid       = "StagingArea"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${local.control_bucket_arn}/${local.staging_keys}"]
  }
  statement {
    # routes entries by the sinks the admin API defined; only the admin API writes it
    sid       = "ReadStreamRegistry"
    effect    = "Allow"
    actions   = ["s3:GetObject"]
    resources = ["${local.control_bucket_arn}/${local.registry_key}"]
  }
  statement {
    # the schema registry document, read each run when a stream is Avro or follows a
    # subject (writer schemas by id, subject streams' types); only ingestors and the admin
    # API write it
    sid       = "ReadSchemaRegistry"
    effect    = "Allow"
    actions   = ["s3:GetObject"]
    resources = ["${local.control_bucket_arn}/${local.schema_registry_key}"]
  }
  statement {
    # with [collector] keep_batches_s > 0 (icefloe.retention): a segment created
    # (conditional put, then a HEAD) before each ack, listed and read by GC, merged and
    # deleted by its compaction
    sid       = "RetentionIndex"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${local.control_bucket_arn}/${local.retention_index_keys}"]
  }
  statement {
    sid       = "ListControlPrefix"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [local.control_bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.batch_prefix}/*"]
    }
  }
  statement {
    sid       = "UseBucketKey"
    effect    = "Allow"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.icefloe.arn]
  }
  dynamic "statement" {
    for_each = local.use_postgres ? [] : [1]
    content {
      sid       = "GlueIcebergCatalog"
      effect    = "Allow"
      actions   = local.glue_catalog_actions
      resources = local.glue_catalog_resources
    }
  }
}

resource "aws_iam_role_policy" "collector" {
  name   = "icefloe-collector"
  role   = aws_iam_role.collector.id
  policy = data.aws_iam_policy_document.collector.json
}

# --- admin API task role ------------------------------------------------------------------

resource "aws_iam_role" "admin" {
  name_prefix        = "${var.name}-admin-"
  description        = "icefloe admin API: rewrite the stream registry, create and evolve tables"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

data "aws_iam_policy_document" "admin" {
  statement {
    # seeded from the config at start, then rewritten by compare-and-swap on every change
    sid       = "RewriteStreamRegistry"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = ["${local.control_bucket_arn}/${local.registry_key}"]
  }
  statement {
    # the schema registry API (icefloe_app.api.schema_registry): read, and rewritten by
    # compare-and-swap on every registration, deletion and compatibility change
    sid       = "RewriteSchemaRegistry"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = ["${local.control_bucket_arn}/${local.schema_registry_key}"]
  }
  statement {
    # what is pending for a source (refusing to drop one the collector has not caught up
    # with) and what is staged for a sink: read, never written
    sid    = "ReadQueueAndStaging"
    effect = "Allow"
    actions = ["s3:GetObject"]
    resources = [
      "${local.control_bucket_arn}/${local.manifest_key}",
      "${local.control_bucket_arn}/${local.manifest_key}-shard*",
      "${local.control_bucket_arn}/${local.manifest_key}.shards",
      "${local.control_bucket_arn}/${local.staging_keys}",
    ]
  }
  statement {
    sid       = "ListControlPrefix"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [local.control_bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.batch_prefix}/*"]
    }
  }
  statement {
    # a new or evolved table writes Iceberg metadata files; the admin deletes none
    sid       = "WriteTableMetadata"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = ["${local.bucket_arn}/${var.warehouse_prefix}/*"]
  }
  statement {
    # pyiceberg's S3 file system lists a key's "folder" before writing a metadata file
    sid       = "ListWarehouse"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.warehouse_prefix}/*"]
    }
  }
  statement {
    sid       = "UseBucketKey"
    effect    = "Allow"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.icefloe.arn]
  }
  dynamic "statement" {
    for_each = local.use_postgres ? [] : [1]
    content {
      sid       = "GlueIcebergCatalog"
      effect    = "Allow"
      actions   = local.glue_catalog_actions
      resources = local.glue_catalog_resources
    }
  }
  # a failed table task drops the empty table it created (pipeline.iceberg.tables:
  # catalog.drop_table); only the admin API drops tables
  dynamic "statement" {
    for_each = local.use_postgres ? [] : [1]
    content {
      sid       = "GlueDropEmptyTable"
      effect    = "Allow"
      actions   = ["glue:DeleteTable"]
      resources = local.glue_catalog_resources
    }
  }
}

resource "aws_iam_role_policy" "admin" {
  name   = "icefloe-admin"
  role   = aws_iam_role.admin.id
  policy = data.aws_iam_policy_document.admin.json
}
