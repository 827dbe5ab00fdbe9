# Least-privilege roles. Ingestors write batch files and read/write the manifest object,
# nothing else: they cannot delete a batch file, list the warehouse or reach the catalog.
# The collector reads, writes and deletes under the store prefix (acks, dequeues, batch-file
# GC) and the warehouse (Iceberg data, metadata, maintenance), and uses the catalog.

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
  description        = "icefloe ingestor tasks: write batch files, append to the manifest queue"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

data "aws_iam_policy_document" "ingestor" {
  statement {
    sid       = "WriteBatchFiles"
    effect    = "Allow"
    actions   = ["s3:PutObject"]
    resources = ["${local.bucket_arn}/${local.batch_keys}"]
  }
  statement {
    sid       = "AppendToManifest"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject"]
    resources = ["${local.bucket_arn}/${local.manifest_key}"]
  }
  statement {
    # the start-up probe writes one small object and removes it again; nothing else is
    # deletable by an ingestor
    sid       = "ConditionalWriteProbe"
    effect    = "Allow"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${local.bucket_arn}/${local.probe_keys}"]
  }
  statement {
    # without ListBucket S3 answers 403 instead of 404 for a manifest that does not exist yet
    sid       = "ListStorePrefix"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]
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
    sid       = "UseBucketKey"
    effect    = "Allow"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.icefloe.arn]
  }
  dynamic "statement" {
    for_each = local.use_postgres ? [] : [1]
    content {
      sid    = "GlueIcebergCatalog"
      effect = "Allow"
      actions = [
        "glue:GetDatabase",
        "glue:GetDatabases",
        "glue:CreateDatabase",
        "glue:GetTable",
        "glue:GetTables",
        "glue:CreateTable",
        "glue:UpdateTable",
      ]
      resources = [
        "arn:${local.partition}:glue:${var.aws_region}:${local.account_id}:catalog",
        "arn:${local.partition}:glue:${var.aws_region}:${local.account_id}:database/*",
        "arn:${local.partition}:glue:${var.aws_region}:${local.account_id}:table/*/*",
      ]
    }
  }
}

resource "aws_iam_role_policy" "collector" {
  name   = "icefloe-collector"
  role   = aws_iam_role.collector.id
  policy = data.aws_iam_policy_document.collector.json
}
