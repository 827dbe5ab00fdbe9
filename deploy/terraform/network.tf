# Security groups: clients -> load balancer (443, 50051) -> ingestors (8080, 50051);
# clients -> Kafka load balancer (9092) -> ingestors (9092, health checks 8080) in kafka.tf;
# collector and admin API -> catalog database (5432); admin_allowed_cidr_blocks -> admin API
# (8081). Tasks reach S3, ECR, Glue and CloudWatch over HTTPS.

resource "aws_security_group" "lb" {
  name_prefix = "${var.name}-lb-"
  description = "icefloe ingest load balancer: HTTPS and gRPC from the allowed clients"
  vpc_id      = var.vpc_id
  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "lb_https" {
  for_each          = toset(var.allowed_cidr_blocks)
  security_group_id = aws_security_group.lb.id
  description       = "HTTPS ingest from ${each.value}"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_ingress_rule" "lb_grpc" {
  for_each          = toset(var.allowed_cidr_blocks)
  security_group_id = aws_security_group.lb.id
  description       = "gRPC ingest (TLS) from ${each.value}"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = local.grpc_port
  to_port           = local.grpc_port
}

resource "aws_vpc_security_group_egress_rule" "lb_to_ingestor_http" {
  security_group_id            = aws_security_group.lb.id
  description                  = "to the ingestors' HTTP port"
  referenced_security_group_id = aws_security_group.ingestor.id
  ip_protocol                  = "tcp"
  from_port                    = local.http_port
  to_port                      = local.http_port
}

resource "aws_vpc_security_group_egress_rule" "lb_to_ingestor_grpc" {
  security_group_id            = aws_security_group.lb.id
  description                  = "to the ingestors' gRPC port"
  referenced_security_group_id = aws_security_group.ingestor.id
  ip_protocol                  = "tcp"
  from_port                    = local.grpc_port
  to_port                      = local.grpc_port
}

resource "aws_security_group" "ingestor" {
  name_prefix = "${var.name}-ingestor-"
  description = "icefloe ingestor tasks: ingest traffic from the load balancer only"
  vpc_id      = var.vpc_id
  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "ingestor_http" {
  security_group_id            = aws_security_group.ingestor.id
  description                  = "HTTP ingest and health checks from the load balancer"
  referenced_security_group_id = aws_security_group.lb.id
  ip_protocol                  = "tcp"
  from_port                    = local.http_port
  to_port                      = local.http_port
}

resource "aws_vpc_security_group_ingress_rule" "ingestor_grpc" {
  security_group_id            = aws_security_group.ingestor.id
  description                  = "gRPC ingest and health checks from the load balancer"
  referenced_security_group_id = aws_security_group.lb.id
  ip_protocol                  = "tcp"
  from_port                    = local.grpc_port
  to_port                      = local.grpc_port
}

resource "aws_vpc_security_group_egress_rule" "ingestor_https" {
  security_group_id = aws_security_group.ingestor.id
  description       = "HTTPS to S3, ECR and CloudWatch Logs"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_security_group" "collector" {
  name_prefix = "${var.name}-collector-"
  description = "icefloe collector task: no inbound traffic"
  vpc_id      = var.vpc_id
  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_egress_rule" "collector_https" {
  security_group_id = aws_security_group.collector.id
  description       = "HTTPS to S3, Glue, ECR and CloudWatch Logs"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_egress_rule" "collector_db" {
  count                        = local.use_postgres ? 1 : 0
  security_group_id            = aws_security_group.collector.id
  description                  = "PostgreSQL catalog"
  referenced_security_group_id = aws_security_group.db[0].id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_security_group" "db" {
  count       = local.use_postgres ? 1 : 0
  name_prefix = "${var.name}-catalog-db-"
  description = "icefloe catalog database: PostgreSQL from the collector only"
  vpc_id      = var.vpc_id
  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "db_from_collector" {
  count                        = local.use_postgres ? 1 : 0
  security_group_id            = aws_security_group.db[0].id
  description                  = "PostgreSQL from the collector"
  referenced_security_group_id = aws_security_group.collector.id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_vpc_security_group_ingress_rule" "db_from_admin" {
  count                        = local.use_postgres ? 1 : 0
  security_group_id            = aws_security_group.db[0].id
  description                  = "PostgreSQL from the admin API"
  referenced_security_group_id = aws_security_group.admin.id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_security_group" "admin" {
  name_prefix = "${var.name}-admin-"
  description = "icefloe admin API task: token-protected API from admin_allowed_cidr_blocks only"
  vpc_id      = var.vpc_id
  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "admin_api" {
  for_each          = toset(var.admin_allowed_cidr_blocks)
  security_group_id = aws_security_group.admin.id
  description       = "admin API from ${each.value}"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = local.admin_port
  to_port           = local.admin_port
}

resource "aws_vpc_security_group_egress_rule" "admin_https" {
  security_group_id = aws_security_group.admin.id
  description       = "HTTPS to S3, Glue, ECR and CloudWatch Logs"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_egress_rule" "admin_db" {
  count                        = local.use_postgres ? 1 : 0
  security_group_id            = aws_security_group.admin.id
  description                  = "PostgreSQL catalog"
  referenced_security_group_id = aws_security_group.db[0].id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}
