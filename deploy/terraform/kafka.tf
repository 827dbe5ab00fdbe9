# Kafka producers (docs/kafka.md): a Network Load Balancer, since Kafka is its own TCP
# protocol and an ALB carries only HTTP and gRPC.
#   9092 TLS -> ingestors' Kafka port 9092 (plain TCP inside the VPC, like the ALB's hops)
# The NLB terminates TLS with certificate_arn, so the ingestors serve plaintext behind it
# (ICEFLOE_INGESTOR_PLAINTEXT, as for HTTP and gRPC). Kafka clients connect to the address
# Metadata advertises, not to the one they bootstrapped from: every ingestor advertises
# local.kafka_advertised_host:9092 (kafka_hostname, else this NLB's DNS name), so all of a
# producer's connections come back through the NLB. Off with enable_kafka = false.

resource "aws_lb" "kafka" {
  count                            = var.enable_kafka ? 1 : 0
  name_prefix                      = "ifkafk"
  load_balancer_type               = "network"
  internal                         = var.load_balancer_internal
  subnets                          = var.load_balancer_subnet_ids
  security_groups                  = [aws_security_group.kafka_lb[0].id]
  enable_cross_zone_load_balancing = true
  enable_deletion_protection       = var.deletion_protection

  # NLB access logs cover TLS listeners (this one); they are delivered by
  # delivery.logs.amazonaws.com (the log bucket's policy, s3.tf)
  access_logs {
    bucket  = aws_s3_bucket.logs.id
    prefix  = "nlb"
    enabled = true
  }

  depends_on = [aws_s3_bucket_policy.logs]
}

resource "aws_lb_target_group" "kafka" {
  count                = var.enable_kafka ? 1 : 0
  name_prefix          = "ifkafk"
  vpc_id               = var.vpc_id
  target_type          = "ip"
  protocol             = "TCP"
  port                 = local.kafka_port
  deregistration_delay = 30
  # traffic arrives from the NLB's own addresses, which the ingestors' security group
  # admits by the NLB's security group (network.tf)
  preserve_client_ip = "false"

  health_check {
    # readiness, as the ALB asks it: the ingestor answers and its object store is reachable
    protocol            = "HTTP"
    port                = local.http_port
    path                = "/readyz"
    matcher             = "200"
    interval            = 10
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb_listener" "kafka" {
  count             = var.enable_kafka ? 1 : 0
  load_balancer_arn = aws_lb.kafka[0].arn
  port              = local.kafka_port
  protocol          = "TLS"
  ssl_policy        = var.ssl_policy
  certificate_arn   = var.certificate_arn

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.kafka[0].arn
  }
}

# --- security groups: clients -> NLB 9092 -> ingestors 9092 (and 8080 for health checks) -

resource "aws_security_group" "kafka_lb" {
  count       = var.enable_kafka ? 1 : 0
  name_prefix = "${var.name}-kafka-lb-"
  description = "icefloe Kafka load balancer: Kafka over TLS from the allowed clients"
  vpc_id      = var.vpc_id
  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "kafka_lb_clients" {
  for_each          = var.enable_kafka ? toset(var.allowed_cidr_blocks) : toset([])
  security_group_id = aws_security_group.kafka_lb[0].id
  description       = "Kafka (TLS) from ${each.value}"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = local.kafka_port
  to_port           = local.kafka_port
}

resource "aws_vpc_security_group_egress_rule" "kafka_lb_to_ingestor_kafka" {
  count                        = var.enable_kafka ? 1 : 0
  security_group_id            = aws_security_group.kafka_lb[0].id
  description                  = "to the ingestors' Kafka port"
  referenced_security_group_id = aws_security_group.ingestor.id
  ip_protocol                  = "tcp"
  from_port                    = local.kafka_port
  to_port                      = local.kafka_port
}

resource "aws_vpc_security_group_egress_rule" "kafka_lb_to_ingestor_health" {
  count                        = var.enable_kafka ? 1 : 0
  security_group_id            = aws_security_group.kafka_lb[0].id
  description                  = "health checks on the ingestors' HTTP port (/readyz)"
  referenced_security_group_id = aws_security_group.ingestor.id
  ip_protocol                  = "tcp"
  from_port                    = local.http_port
  to_port                      = local.http_port
}

resource "aws_vpc_security_group_ingress_rule" "ingestor_kafka" {
  count                        = var.enable_kafka ? 1 : 0
  security_group_id            = aws_security_group.ingestor.id
  description                  = "Kafka produce protocol from the Kafka load balancer"
  referenced_security_group_id = aws_security_group.kafka_lb[0].id
  ip_protocol                  = "tcp"
  from_port                    = local.kafka_port
  to_port                      = local.kafka_port
}

resource "aws_vpc_security_group_ingress_rule" "ingestor_kafka_health" {
  count                        = var.enable_kafka ? 1 : 0
  security_group_id            = aws_security_group.ingestor.id
  description                  = "health checks (/readyz) from the Kafka load balancer"
  referenced_security_group_id = aws_security_group.kafka_lb[0].id
  ip_protocol                  = "tcp"
  from_port                    = local.http_port
  to_port                      = local.http_port
}
