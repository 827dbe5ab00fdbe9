# icefloe on AWS: an S3 bucket (batch files, manifest queue, Iceberg warehouse), least-
# privilege task roles, ECS Fargate ingestors behind an Application Load Balancer (HTTP and
# gRPC) and a Network Load Balancer (Kafka, kafka.tf) with CPU autoscaling, exactly one
# collector task, an Iceberg catalog (Glue or RDS PostgreSQL) and CloudWatch logs, all
# encrypted with one customer-managed KMS key.

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  region     = var.aws_region

  bucket_name = coalesce(var.bucket_name, "${var.name}-${local.account_id}-${var.aws_region}")

  # icefloe's defaults (icefloe/config/model.py): the ports every role listens on
  http_port    = 8080
  grpc_port    = 50051
  metrics_port = 9464
  admin_port   = 8081
  # [ingestor] kafka_port has no default (off); Kafka's own port, as `icefloe up` serves it
  kafka_port = 9092
  # [ingestor] otlp_http_port / otlp_grpc_port have no default (off); OTLP's own ports, which
  # exporters use unless told otherwise, as `icefloe up` serves them (with enable_otlp)
  otlp_http_port = 4318
  otlp_grpc_port = 4317

  # what the load balancer forwards (lb.tf): the ingest routes of ingestor/http/steps.py and
  # the icefloe.v1.Ingest gRPC service; /metrics, /healthz, /readyz and gRPC reflection and
  # health stay inside the VPC
  ingest_http_paths = ["/v1/streams/*/events", "/ingest/*", "/collect/*"]
  ingest_grpc_paths = ["/icefloe.v1.Ingest/*"]
  # with enable_otlp (otlp.tf): OTLP/HTTP's three signal paths and the three OTLP/gRPC
  # Export services (docs/otlp-receivers.md), nothing else of those ports
  otlp_http_paths = ["/v1/logs", "/v1/traces", "/v1/metrics"]
  otlp_grpc_paths = [
    "/opentelemetry.proto.collector.logs.v1.LogsService/*",
    "/opentelemetry.proto.collector.trace.v1.TraceService/*",
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/*",
  ]

  # where icefloe keeps its objects. The data bucket (versioned) holds batch files and the
  # warehouse; the control bucket (unversioned: see s3.tf) holds the objects rewritten by
  # compare-and-swap. Keys are relative to the store URLs (icefloe.manifest.publish, [manifest] key,
  # [admin] registry_key, icefloe.staging, icefloe.store.probe).
  control_bucket_name = "${local.bucket_name}-control"
  store_url           = "s3://${local.bucket_name}/${var.batch_prefix}"
  control_url         = "s3://${local.control_bucket_name}/${var.batch_prefix}"
  warehouse_url       = "s3://${local.bucket_name}/${var.warehouse_prefix}"
  batch_keys          = "${var.batch_prefix}/batches/*"
  manifest_key        = "${var.batch_prefix}/manifest/queue"
  registry_key        = "${var.batch_prefix}/registry/registry.json"
  # the schema registry's document, next to the stream registry
  # (icefloe.schemas.store.schema_key): read by ingestors and the collector for Avro and
  # subject streams, extended by the ingestors and rewritten by the admin API (both CAS)
  schema_registry_key = "${var.batch_prefix}/registry/schemas.json"
  staging_keys        = "${var.batch_prefix}/staging/*"
  probe_keys          = "${var.batch_prefix}/_icefloe/probe/*"
  # the collector's dedup journal (collector.journal.PREFIX) and catalog-version counter
  # (icefloe.catalog_version.VERSION_KEY)
  dedup_keys          = "${var.batch_prefix}/dedup/*"
  catalog_version_key = "${var.batch_prefix}/catalog/version.json"
  # the retention index (icefloe.retention.INDEX_PREFIX), written by the collector before
  # each ack with [collector] keep_batches_s > 0; read by GC and `icefloe replay`
  retention_index_keys = "${var.batch_prefix}/retention/index/*"
  # where the collector holding the lease answers HTTP (icefloe.collector_address.KEY):
  # written when it takes the lease, read before writing (a newer holder's is kept)
  collector_address_key = "${var.batch_prefix}/collector/address.json"
  # the Kafka listener's producer-id counter, next to the registry
  # (ingestor.kafka.producer_ids.producer_ids_key); claimed by compare-and-swap at start
  kafka_producer_ids_key = "${var.batch_prefix}/registry/kafka/producer-ids.json"
  bucket_arn          = "arn:${local.partition}:s3:::${local.bucket_name}"
  control_bucket_arn  = "arn:${local.partition}:s3:::${local.control_bucket_name}"
  use_postgres        = var.catalog == "postgres"

  # what pyiceberg's Glue catalog calls (collector and admin), in this account and region
  glue_catalog_actions = [
    "glue:GetDatabase",
    "glue:GetDatabases",
    "glue:CreateDatabase",
    "glue:GetTable",
    "glue:GetTables",
    "glue:CreateTable",
    "glue:UpdateTable",
  ]
  glue_catalog_resources = [
    "arn:${local.partition}:glue:${var.aws_region}:${local.account_id}:catalog",
    "arn:${local.partition}:glue:${var.aws_region}:${local.account_id}:database/*",
    "arn:${local.partition}:glue:${var.aws_region}:${local.account_id}:table/*/*",
  ]
  config_file_path = coalesce(var.config_file, "${path.module}/icefloe.toml")

  image = "${aws_ecr_repository.icefloe.repository_url}:${var.image_tag}"

  # the icefloe command lines (the image's entrypoint runs `icefloe ARGS`)
  ingestor_command  = ["ingestor", "--log-format", "json"]
  collector_command = ["collector", "--log-format", "json"]
  admin_command     = ["admin", "--log-format", "json"]

  # environment of the containers (concatenated per role in ecs.tf)
  environment_common = [
    { name = "ICEFLOE_STORE_URL", value = local.store_url },
    { name = "ICEFLOE_STORE_CONTROL_URL", value = local.control_url },
    { name = "ICEFLOE_STORE_REGION", value = var.aws_region },
    { name = "ICEFLOE_DATA_DIR", value = "/tmp/icefloe-data" },
    { name = "AWS_REGION", value = var.aws_region },
    { name = "AWS_DEFAULT_REGION", value = var.aws_region },
  ]
  environment_ingestor = [
    { name = "ICEFLOE_INGESTOR_HOST", value = "0.0.0.0" },
    # TLS terminates at the ALB (and the Kafka NLB); the hop to the task stays in the VPC
    { name = "ICEFLOE_INGESTOR_PLAINTEXT", value = "true" },
  ]
  # with enable_otlp only (ecs.tf): every role generates the [otlp] streams and tables
  # (docs/otlp.md); the ingestors also serve OTLP's own ports
  environment_otlp = [
    { name = "ICEFLOE_OTLP_ENABLED", value = "true" },
  ]
  environment_otlp_ports = [
    { name = "ICEFLOE_INGESTOR_OTLP_HTTP_PORT", value = "${local.otlp_http_port}" },
    { name = "ICEFLOE_INGESTOR_OTLP_GRPC_PORT", value = "${local.otlp_grpc_port}" },
  ]
  # with enable_kafka only (ecs.tf). Kafka clients connect to the address Metadata
  # advertises: the NLB, under kafka_hostname when given (it must match the certificate)
  kafka_advertised_host = var.enable_kafka ? coalesce(var.kafka_hostname, aws_lb.kafka[0].dns_name) : ""
  environment_kafka = [
    { name = "ICEFLOE_INGESTOR_KAFKA_PORT", value = "${local.kafka_port}" },
    { name = "ICEFLOE_INGESTOR_KAFKA_ADVERTISED_HOST", value = local.kafka_advertised_host },
    { name = "ICEFLOE_INGESTOR_KAFKA_ADVERTISED_PORT", value = "${local.kafka_port}" },
    # below the NLB's fixed 350 s TCP idle timeout: the ingestor closes an idle producer
    # connection itself instead of the NLB dropping it silently
    { name = "ICEFLOE_INGESTOR_KAFKA_IDLE_S", value = "300" },
  ]
  environment_collector = [
    { name = "ICEFLOE_CATALOG_TYPE", value = local.use_postgres ? "sql" : "glue" },
    { name = "ICEFLOE_CATALOG_WAREHOUSE", value = local.warehouse_url },
    { name = "ICEFLOE_COLLECTOR_HOST", value = "0.0.0.0" },
    # metrics and probes stay inside the VPC
    { name = "ICEFLOE_COLLECTOR_PLAINTEXT", value = "true" },
    # Spark and the JVM write scratch files under $HOME; the root filesystem is read-only
    { name = "HOME", value = "/tmp" },
  ]
  environment_admin = [
    { name = "ICEFLOE_CATALOG_TYPE", value = local.use_postgres ? "sql" : "glue" },
    { name = "ICEFLOE_CATALOG_WAREHOUSE", value = local.warehouse_url },
    # reachable from admin_allowed_cidr_blocks only (network.tf), inside the VPC and with
    # no load balancer in front; every call needs a token
    { name = "ICEFLOE_ADMIN_HOST", value = "0.0.0.0" },
    # plaintext inside the VPC, like the collector's port (and the admin in the Kubernetes
    # and Compose forms): without it or TLS files, `icefloe admin` refuses a non-loopback
    # bind (icefloe.server_tls.section_tls). For TLS to the task, set [admin]
    # tls_cert_file and tls_key_file in your config file and drop this variable (icefloe
    # refuses plaintext = true beside TLS files)
    { name = "ICEFLOE_ADMIN_PLAINTEXT", value = "true" },
  ]
  # the config file travels as a secret: write-token hashes may be in it
  config_secret = [{ name = "CONFIG_TOML", valueFrom = aws_secretsmanager_secret.config.arn }]
  catalog_secret = local.use_postgres ? [
    { name = "ICEFLOE_CATALOG_URI", valueFrom = aws_secretsmanager_secret.catalog_uri[0].arn },
  ] : []
}

# --- encryption key: S3, CloudWatch Logs, ECR, Secrets Manager, RDS ---------------------------

resource "aws_kms_key" "icefloe" {
  description             = "${var.name}: encrypts the bucket, logs, image repository, secrets and catalog database"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "AccountAdministersKeyThroughIam"
        Effect    = "Allow"
        Principal = { AWS = "arn:${local.partition}:iam::${local.account_id}:root" }
        Action    = "kms:*"
        Resource  = "*"
      },
      {
        Sid       = "CloudWatchLogsUsesKeyForThisServiceLogGroups"
        Effect    = "Allow"
        Principal = { Service = "logs.${var.aws_region}.amazonaws.com" }
        Action = [
          "kms:Encrypt",
          "kms:Decrypt",
          "kms:ReEncrypt*",
          "kms:GenerateDataKey*",
          "kms:Describe*",
        ]
        Resource = "*"
        Condition = {
          ArnLike = {
            "kms:EncryptionContext:aws:logs:arn" = "arn:${local.partition}:logs:${var.aws_region}:${local.account_id}:log-group:/${var.name}/*"
          }
        }
      },
    ]
  })
}

resource "aws_kms_alias" "icefloe" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.icefloe.key_id
}

# --- configuration (may hold token hashes: kept as a secret) ---------------------------------

resource "aws_secretsmanager_secret" "config" {
  name_prefix             = "${var.name}-config-"
  description             = "icefloe.toml for the ${var.name} ingestors and collector"
  kms_key_id              = aws_kms_key.icefloe.arn
  recovery_window_in_days = 7
}

resource "aws_secretsmanager_secret_version" "config" {
  secret_id     = aws_secretsmanager_secret.config.id
  secret_string = file(local.config_file_path)
}
