# OpenTelemetry's protocol (docs/otlp-receivers.md), with enable_otlp (off by default): two
# more TLS listeners on the ingest Application Load Balancer, on OTLP's own ports, which
# exporters use unless told otherwise.
#   4318 HTTPS -> ingestors' OTLP/HTTP port 4318, only /v1/logs, /v1/traces, /v1/metrics
#   4317 HTTPS -> ingestors' OTLP/gRPC port 4317, only the three OTLP Export services
#                 (target group protocol version GRPC; ALB gRPC needs TLS)
# The ingestors serve them plaintext inside the VPC (ICEFLOE_INGESTOR_OTLP_HTTP_PORT /
# _GRPC_PORT, local.environment_otlp_ports), and every role gets ICEFLOE_OTLP_ENABLED=true so
# the collector and the admin API know the generated otel.* streams and tables (ecs.tf).
# Exporters authenticate with a stream token (Authorization: Bearer), like any client.

resource "aws_lb_target_group" "otlp_http" {
  count                = var.enable_otlp ? 1 : 0
  name_prefix          = "ifohtp"
  vpc_id               = var.vpc_id
  target_type          = "ip"
  protocol             = "HTTP"
  port                 = local.otlp_http_port
  deregistration_delay = 30

  health_check {
    # the same HTTP server answers on both of its ports: readiness, object store included
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

resource "aws_lb_target_group" "otlp_grpc" {
  count                = var.enable_otlp ? 1 : 0
  name_prefix          = "ifogrp"
  vpc_id               = var.vpc_id
  target_type          = "ip"
  protocol             = "HTTP"
  protocol_version     = "GRPC"
  port                 = local.otlp_grpc_port
  deregistration_delay = 30

  health_check {
    # the same gRPC server answers on both of its ports, grpc.health.v1 included
    path                = "/grpc.health.v1.Health/Check"
    matcher             = "0"
    interval            = 10
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb_listener" "otlp_http" {
  count             = var.enable_otlp ? 1 : 0
  load_balancer_arn = aws_lb.ingest.arn
  port              = local.otlp_http_port
  protocol          = "HTTPS"
  ssl_policy        = var.ssl_policy
  certificate_arn   = var.certificate_arn

  default_action {
    type = "fixed-response"
    fixed_response {
      content_type = "application/json"
      status_code  = "404"
      message_body = "{\"error\":\"not_found\"}"
    }
  }
}

resource "aws_lb_listener_rule" "otlp_http" {
  count        = var.enable_otlp ? 1 : 0
  listener_arn = aws_lb_listener.otlp_http[0].arn
  priority     = 10

  condition {
    path_pattern {
      values = local.otlp_http_paths
    }
  }

  action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.otlp_http[0].arn
  }
}

resource "aws_lb_listener" "otlp_grpc" {
  count             = var.enable_otlp ? 1 : 0
  load_balancer_arn = aws_lb.ingest.arn
  port              = local.otlp_grpc_port
  protocol          = "HTTPS"
  ssl_policy        = var.ssl_policy
  certificate_arn   = var.certificate_arn

  default_action {
    type = "fixed-response"
    fixed_response {
      content_type = "application/grpc"
      status_code  = "404"
    }
  }
}

resource "aws_lb_listener_rule" "otlp_grpc" {
  count        = var.enable_otlp ? 1 : 0
  listener_arn = aws_lb_listener.otlp_grpc[0].arn
  priority     = 10

  condition {
    path_pattern {
      values = local.otlp_grpc_paths
    }
  }

  action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.otlp_grpc[0].arn
  }
}

# clients -> load balancer on 4318/4317; load balancer -> ingestors on 4318/4317
resource "aws_vpc_security_group_ingress_rule" "lb_otlp_http" {
  for_each          = var.enable_otlp ? toset(var.allowed_cidr_blocks) : toset([])
  security_group_id = aws_security_group.lb.id
  description       = "OTLP/HTTP (TLS) from ${each.value}"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = local.otlp_http_port
  to_port           = local.otlp_http_port
}

resource "aws_vpc_security_group_ingress_rule" "lb_otlp_grpc" {
  for_each          = var.enable_otlp ? toset(var.allowed_cidr_blocks) : toset([])
  security_group_id = aws_security_group.lb.id
  description       = "OTLP/gRPC (TLS) from ${each.value}"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = local.otlp_grpc_port
  to_port           = local.otlp_grpc_port
}

resource "aws_vpc_security_group_egress_rule" "lb_to_ingestor_otlp" {
  count                        = var.enable_otlp ? 1 : 0
  security_group_id            = aws_security_group.lb.id
  description                  = "to the ingestors' OTLP ports (gRPC 4317, HTTP 4318)"
  referenced_security_group_id = aws_security_group.ingestor.id
  ip_protocol                  = "tcp"
  from_port                    = local.otlp_grpc_port
  to_port                      = local.otlp_http_port
}

resource "aws_vpc_security_group_ingress_rule" "ingestor_otlp" {
  count                        = var.enable_otlp ? 1 : 0
  security_group_id            = aws_security_group.ingestor.id
  description                  = "OTLP ingest and health checks from the load balancer"
  referenced_security_group_id = aws_security_group.lb.id
  ip_protocol                  = "tcp"
  from_port                    = local.otlp_grpc_port
  to_port                      = local.otlp_http_port
}
