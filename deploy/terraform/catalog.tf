# The Iceberg catalog. catalog = "glue": the AWS Glue Data Catalog (nothing to create here;
# the collector creates its databases and tables, see iam.tf). catalog = "postgres": a
# pyiceberg SQL catalog on a private, encrypted RDS PostgreSQL instance; the collector gets
# the connection URI (with the generated password) from Secrets Manager.

resource "random_password" "db" {
  count   = local.use_postgres ? 1 : 0
  length  = 40
  special = false # the password goes into a URI unescaped
}

resource "aws_db_subnet_group" "catalog" {
  count       = local.use_postgres ? 1 : 0
  name_prefix = "${var.name}-catalog-"
  description = "icefloe catalog database subnets"
  subnet_ids  = var.private_subnet_ids
}

resource "aws_db_parameter_group" "catalog" {
  count       = local.use_postgres ? 1 : 0
  name_prefix = "${var.name}-catalog-"
  family      = "postgres${var.db_engine_version}"
  description = "icefloe catalog: log slow statements and connections, require TLS"

  parameter {
    name  = "log_min_duration_statement"
    value = "1000"
  }
  parameter {
    name  = "log_statement"
    value = "ddl"
  }
  parameter {
    name  = "log_connections"
    value = "1"
  }
  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }

  lifecycle {
    create_before_destroy = true
  }
}

data "aws_iam_policy_document" "rds_monitoring_assume" {
  statement {
    sid     = "RdsEnhancedMonitoring"
    effect  = "Allow"
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["monitoring.rds.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_iam_role" "rds_monitoring" {
  count              = local.use_postgres ? 1 : 0
  name_prefix        = "${var.name}-rds-mon-"
  description        = "RDS enhanced monitoring of the icefloe catalog database"
  assume_role_policy = data.aws_iam_policy_document.rds_monitoring_assume.json
}

resource "aws_iam_role_policy_attachment" "rds_monitoring" {
  count      = local.use_postgres ? 1 : 0
  role       = aws_iam_role.rds_monitoring[0].name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonRDSEnhancedMonitoringRole"
}

resource "aws_db_instance" "catalog" {
  count                               = local.use_postgres ? 1 : 0
  identifier_prefix                   = "${var.name}-catalog-"
  engine                              = "postgres"
  engine_version                      = var.db_engine_version
  instance_class                      = var.db_instance_class
  allocated_storage                   = var.db_allocated_storage_gib
  storage_type                        = "gp3"
  storage_encrypted                   = true
  kms_key_id                          = aws_kms_key.icefloe.arn
  db_name                             = "icefloe"
  username                            = "icefloe"
  password                            = random_password.db[0].result
  port                                = 5432
  db_subnet_group_name                = aws_db_subnet_group.catalog[0].name
  parameter_group_name                = aws_db_parameter_group.catalog[0].name
  vpc_security_group_ids              = [aws_security_group.db[0].id]
  publicly_accessible                 = false
  multi_az                            = var.db_multi_az
  iam_database_authentication_enabled = true
  deletion_protection                 = var.deletion_protection
  backup_retention_period             = var.db_backup_retention_days
  copy_tags_to_snapshot               = true
  auto_minor_version_upgrade          = true
  enabled_cloudwatch_logs_exports     = ["postgresql", "upgrade"]
  monitoring_interval                 = 60
  monitoring_role_arn                 = aws_iam_role.rds_monitoring[0].arn
  performance_insights_enabled        = true
  performance_insights_kms_key_id     = aws_kms_key.icefloe.arn
  skip_final_snapshot                 = false
  final_snapshot_identifier           = "${var.name}-catalog-final"
  apply_immediately                   = false

  depends_on = [aws_iam_role_policy_attachment.rds_monitoring]
}

resource "aws_secretsmanager_secret" "catalog_uri" {
  count                   = local.use_postgres ? 1 : 0
  name_prefix             = "${var.name}-catalog-uri-"
  description             = "icefloe collector: SQL catalog URI (PostgreSQL, with password)"
  kms_key_id              = aws_kms_key.icefloe.arn
  recovery_window_in_days = 7
}

resource "aws_secretsmanager_secret_version" "catalog_uri" {
  count     = local.use_postgres ? 1 : 0
  secret_id = aws_secretsmanager_secret.catalog_uri[0].id
  # sslmode=require: the parameter group refuses unencrypted connections
  secret_string = "postgresql://icefloe:${random_password.db[0].result}@${aws_db_instance.catalog[0].address}:5432/icefloe?sslmode=require"
}
