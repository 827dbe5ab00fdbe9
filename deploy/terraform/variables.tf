# --- general ------------------------------------------------------------------------------

variable "name" {
  description = "Name prefix of every resource (bucket, roles, cluster, services, log groups)."
  type        = string
  default     = "icefloe"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,20}$", var.name))
    error_message = "name: 2-21 lower-case letters, digits or '-', starting with a letter."
  }
}

variable "aws_region" {
  description = "AWS region to deploy into (also given to icefloe as the store and Glue region)."
  type        = string
  default     = "us-east-1"
}

variable "tags" {
  description = "Extra tags for every resource (merged into the provider's default tags)."
  type        = map(string)
  default     = {}
}

# --- network ------------------------------------------------------------------------------

variable "vpc_id" {
  description = "VPC that holds the load balancer, the ECS tasks and the catalog database."
  type        = string
}

variable "private_subnet_ids" {
  description = "Private subnets (two or more AZs) for the ECS tasks and the RDS catalog. They need a route to S3, ECR and CloudWatch Logs (NAT gateway or VPC endpoints)."
  type        = list(string)
}

variable "load_balancer_subnet_ids" {
  description = "Subnets (two or more AZs) for the load balancer: public ones when load_balancer_internal is false."
  type        = list(string)
}

variable "load_balancer_internal" {
  description = "Whether the ingest load balancer is internal (reachable only from the VPC and its peers)."
  type        = bool
  default     = true
}

variable "allowed_cidr_blocks" {
  description = "Client CIDR blocks allowed to reach the ingest endpoints (HTTPS 443, gRPC 50051, with enable_kafka Kafka 9092, with enable_otlp OTLP 4318 and 4317)."
  type        = list(string)
  default     = ["10.0.0.0/8"]
}

variable "certificate_arn" {
  description = "ACM certificate ARN for the load balancers' TLS listeners (HTTPS on 443, gRPC on 50051; ALB gRPC needs TLS; Kafka on 9092 with enable_kafka; OTLP on 4318 and 4317 with enable_otlp)."
  type        = string
}

variable "enable_kafka" {
  description = "Serve Kafka's produce protocol: a Network Load Balancer with a TLS listener on 9092 in front of the ingestors' Kafka port (docs/kafka.md)."
  type        = bool
  default     = true
}

variable "enable_otlp" {
  description = "Serve OpenTelemetry's protocol (docs/otlp-receivers.md): the [otlp] tables on every role, and TLS listeners on OTLP's own ports 4318 (OTLP/HTTP) and 4317 (OTLP/gRPC) of the ingest load balancer in front of the ingestors' OTLP ports."
  type        = bool
  default     = false
}

variable "kafka_hostname" {
  description = "DNS name Kafka clients use (a record you point at kafka_load_balancer_dns_name, covered by certificate_arn); the ingestors advertise it. null advertises the NLB's own DNS name, which the certificate does not cover: clients then fail TLS hostname verification."
  type        = string
  default     = null
}

variable "ssl_policy" {
  description = "TLS policy of the load balancer listeners (HTTPS, gRPC and Kafka)."
  type        = string
  default     = "ELBSecurityPolicy-TLS13-1-2-2021-06"
}

variable "deletion_protection" {
  description = "Deletion protection for the load balancer and the RDS catalog database."
  type        = bool
  default     = true
}

# --- object store ------------------------------------------------------------------------

variable "bucket_name" {
  description = "Name of the S3 data bucket for batch files and the Iceberg warehouse; null picks <name>-<account id>-<region>. The unversioned control bucket (manifest, registry, staging state) is named <bucket>-control."
  type        = string
  default     = null
}

variable "batch_prefix" {
  description = "Key prefix of icefloe's store inside both buckets (batch files in the data bucket; manifest, registry and staging in the control bucket): the store URLs are s3://BUCKET/PREFIX and s3://BUCKET-control/PREFIX."
  type        = string
  default     = "ingest"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]*$", var.batch_prefix))
    error_message = "batch_prefix: one path segment (letters, digits, '.', '_', '-'), no slashes."
  }
}

variable "warehouse_prefix" {
  description = "Key prefix of the Iceberg warehouse inside the bucket (table data and metadata)."
  type        = string
  default     = "warehouse"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]*$", var.warehouse_prefix))
    error_message = "warehouse_prefix: one path segment (letters, digits, '.', '_', '-'), no slashes."
  }
}

variable "noncurrent_version_days" {
  description = "Days a replaced or deleted object version in the data bucket (collected batch files, warehouse objects) is kept before it expires. The manifest lives in the unversioned control bucket."
  type        = number
  default     = 3
}

variable "abort_multipart_days" {
  description = "Days after which incomplete multipart uploads are aborted and their parts deleted."
  type        = number
  default     = 2
}

variable "access_log_retention_days" {
  description = "Days S3 server access logs and load balancer access logs are kept in the log bucket."
  type        = number
  default     = 365
}

# --- logging ------------------------------------------------------------------------------

variable "log_retention_days" {
  description = "Retention of the CloudWatch log groups of the ingestors and the collector, in days."
  type        = number
  default     = 365
}

# --- image and configuration ---------------------------------------------------------------

variable "image_tag" {
  description = "Tag of the icefloe image in the ECR repository this module creates (build deploy/docker/Dockerfile and push it there)."
  type        = string
  default     = "0.1.0"
}

variable "config_file" {
  description = "Path of the icefloe.toml (streams, tuning) given to every task; null uses icefloe.toml next to this module. Store and catalog settings come from this module."
  type        = string
  default     = null
}

# --- ingestors ----------------------------------------------------------------------------

variable "ingestor_cpu" {
  description = "Fargate CPU units of one ingestor task (1024 = 1 vCPU)."
  type        = number
  default     = 1024
}

variable "ingestor_memory" {
  description = "Fargate memory of one ingestor task, in MiB."
  type        = number
  default     = 2048
}

variable "ingestor_min_count" {
  description = "Fewest ingestor tasks the autoscaler keeps (also the initial count)."
  type        = number
  default     = 2
}

variable "ingestor_max_count" {
  description = "Most ingestor tasks the autoscaler starts."
  type        = number
  default     = 10
}

variable "ingestor_cpu_target" {
  description = "Average CPU utilization (percent) the ingestor autoscaler aims for."
  type        = number
  default     = 60
}

# --- collector ----------------------------------------------------------------------------

variable "collector_cpu" {
  description = "Fargate CPU units of the collector task (Spark runs local[N] inside it)."
  type        = number
  default     = 2048
}

variable "collector_memory" {
  description = "Fargate memory of the collector task, in MiB (Spark driver + Python workers)."
  type        = number
  default     = 8192
}

variable "collector_ephemeral_storage_gib" {
  description = "Ephemeral storage of the collector task in GiB (Spark scratch space under /tmp); 21-200."
  type        = number
  default     = 40
}

# --- catalog ------------------------------------------------------------------------------

variable "catalog" {
  description = "Iceberg catalog: \"glue\" (AWS Glue Data Catalog) or \"postgres\" (a pyiceberg SQL catalog on an encrypted, private RDS PostgreSQL instance)."
  type        = string
  default     = "glue"

  validation {
    condition     = contains(["glue", "postgres"], var.catalog)
    error_message = "catalog must be \"glue\" or \"postgres\"."
  }
}

variable "db_instance_class" {
  description = "RDS instance class of the PostgreSQL catalog (catalog = \"postgres\")."
  type        = string
  default     = "db.t4g.medium"
}

variable "db_engine_version" {
  description = "PostgreSQL major version of the RDS catalog."
  type        = string
  default     = "16"
}

variable "db_allocated_storage_gib" {
  description = "Storage of the RDS catalog in GiB (the catalog holds only table pointers)."
  type        = number
  default     = 20
}

variable "db_multi_az" {
  description = "Whether the RDS catalog runs Multi-AZ (a standby in a second AZ)."
  type        = bool
  default     = true
}

variable "db_backup_retention_days" {
  description = "Days of automated RDS backups of the catalog."
  type        = number
  default     = 14
}

# --- admin API ----------------------------------------------------------------------------

variable "admin_count" {
  description = "Admin API tasks (0 or 1). The admin API refuses to start without [admin] tokens in the config file: put a hash line from `icefloe token new` there, then set 1."
  type        = number
  default     = 0

  validation {
    condition     = contains([0, 1], var.admin_count)
    error_message = "admin_count must be 0 or 1."
  }
}

variable "admin_allowed_cidr_blocks" {
  description = "CIDR blocks allowed to reach the admin API (port 8081, token-protected) inside the VPC; empty: none (reach it through a bastion or a peered network you add)."
  type        = list(string)
  default     = []
}
