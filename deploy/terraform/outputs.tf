output "bucket_name" {
  description = "Versioned S3 data bucket holding batch files and the Iceberg warehouse."
  value       = aws_s3_bucket.data.id
}

output "control_bucket_name" {
  description = "Unversioned S3 bucket holding the manifest queue, the stream registry and staging state."
  value       = aws_s3_bucket.control.id
}

output "log_bucket_name" {
  description = "S3 bucket receiving the data bucket's access logs and the load balancer's access logs."
  value       = aws_s3_bucket.logs.id
}

output "store_url" {
  description = "icefloe store URL ([store] url) the tasks use, e.g. for `icefloe inspect manifest --store`."
  value       = local.store_url
}

output "control_url" {
  description = "icefloe control URL ([store] control_url): where the manifest, registry and staging state live."
  value       = local.control_url
}

output "warehouse_url" {
  description = "Iceberg warehouse location ([catalog] warehouse)."
  value       = local.warehouse_url
}

output "kms_key_arn" {
  description = "ARN of the KMS key encrypting the bucket, logs, image repository, secrets and database."
  value       = aws_kms_key.icefloe.arn
}

output "ecr_repository_url" {
  description = "ECR repository to push the icefloe image to (tag it with image_tag)."
  value       = aws_ecr_repository.icefloe.repository_url
}

output "image" {
  description = "Full image reference the task definitions run."
  value       = local.image
}

output "ecs_cluster_name" {
  description = "Name of the ECS cluster running the ingestors and the collector."
  value       = aws_ecs_cluster.icefloe.name
}

output "ingestor_service_name" {
  description = "Name of the autoscaled ingestor ECS service."
  value       = aws_ecs_service.ingestor.name
}

output "collector_service_name" {
  description = "Name of the single-task collector ECS service."
  value       = aws_ecs_service.collector.name
}

output "load_balancer_dns_name" {
  description = "DNS name of the ingest load balancer (point your certificate's hostname at it)."
  value       = aws_lb.ingest.dns_name
}

output "http_ingest_url" {
  description = "HTTPS ingest base URL: POST {url}/v1/streams/{stream}/events."
  value       = "https://${aws_lb.ingest.dns_name}"
}

output "grpc_ingest_target" {
  description = "gRPC ingest target (TLS), host:port, for icefloe.v1.Ingest clients."
  value       = "${aws_lb.ingest.dns_name}:${local.grpc_port}"
}

output "otlp_http_endpoint" {
  description = "OTEL_EXPORTER_OTLP_ENDPOINT for OTLP/HTTP exporters (TLS; /v1/logs, /v1/traces, /v1/metrics are appended); null when enable_otlp is false."
  value       = var.enable_otlp ? "https://${aws_lb.ingest.dns_name}:${local.otlp_http_port}" : null
}

output "otlp_grpc_endpoint" {
  description = "OTLP/gRPC exporters' endpoint (TLS), host:port; null when enable_otlp is false."
  value       = var.enable_otlp ? "${aws_lb.ingest.dns_name}:${local.otlp_grpc_port}" : null
}

output "kafka_bootstrap" {
  description = "Kafka bootstrap.servers (TLS), host:port: the address every ingestor advertises; null when enable_kafka is false."
  value       = var.enable_kafka ? "${local.kafka_advertised_host}:${local.kafka_port}" : null
}

output "kafka_load_balancer_dns_name" {
  description = "DNS name of the Kafka Network Load Balancer (point kafka_hostname at it); null when enable_kafka is false."
  value       = var.enable_kafka ? aws_lb.kafka[0].dns_name : null
}

output "ingestor_role_arn" {
  description = "IAM role of the ingestor tasks (write batch files and the manifest; no delete)."
  value       = aws_iam_role.ingestor.arn
}

output "collector_role_arn" {
  description = "IAM role of the collector task (store and warehouse read/write/delete, catalog)."
  value       = aws_iam_role.collector.arn
}

output "admin_role_arn" {
  description = "IAM role of the admin API task (rewrite the registry, read the queue and staging state, write table metadata; no delete)."
  value       = aws_iam_role.admin.arn
}

output "admin_service_name" {
  description = "Name of the admin API ECS service (admin_count tasks)."
  value       = aws_ecs_service.admin.name
}

output "catalog_type" {
  description = "Iceberg catalog in use: glue or postgres."
  value       = var.catalog
}

output "catalog_db_endpoint" {
  description = "Endpoint (host:port) of the RDS PostgreSQL catalog; null when catalog = \"glue\"."
  value       = local.use_postgres ? aws_db_instance.catalog[0].endpoint : null
}

output "catalog_uri_secret_arn" {
  description = "Secrets Manager secret holding the catalog URI with its password; null when catalog = \"glue\"."
  value       = local.use_postgres ? aws_secretsmanager_secret.catalog_uri[0].arn : null
}

output "log_group_names" {
  description = "CloudWatch log groups of the ingestors and the collector."
  value = {
    ingestor  = aws_cloudwatch_log_group.ingestor.name
    collector = aws_cloudwatch_log_group.collector.name
    admin     = aws_cloudwatch_log_group.admin.name
  }
}
