# The ingest entry point: an Application Load Balancer with two TLS listeners.
#   443   HTTPS -> ingestors' HTTP port 8080, only the ingest routes (local.ingest_http_paths)
#   50051 HTTPS -> ingestors' gRPC port 50051, only the icefloe.v1.Ingest service
#                  (ALB target group protocol version GRPC)
# Everything else (/metrics, /healthz, /readyz, reflection, the health service) answers 404
# at the load balancer: the target groups' health checks reach the tasks directly.
# ALB speaks gRPC only over TLS, hence one certificate for both listeners.

resource "aws_lb" "ingest" {
  name_prefix                = substr(var.name, 0, 6)
  load_balancer_type         = "application"
  internal                   = var.load_balancer_internal
  subnets                    = var.load_balancer_subnet_ids
  security_groups            = [aws_security_group.lb.id]
  drop_invalid_header_fields = true
  enable_deletion_protection = var.deletion_protection
  idle_timeout               = 120

  access_logs {
    bucket  = aws_s3_bucket.logs.id
    prefix  = "alb"
    enabled = true
  }

  depends_on = [aws_s3_bucket_policy.logs]
}

resource "aws_lb_target_group" "http" {
  name_prefix          = "ifhttp"
  vpc_id               = var.vpc_id
  target_type          = "ip"
  protocol             = "HTTP"
  port                 = local.http_port
  deregistration_delay = 30

  health_check {
    # readiness: the ingestor answers and its object store is reachable
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

resource "aws_lb_target_group" "grpc" {
  name_prefix          = "ifgrpc"
  vpc_id               = var.vpc_id
  target_type          = "ip"
  protocol             = "HTTP"
  protocol_version     = "GRPC"
  port                 = local.grpc_port
  deregistration_delay = 30

  health_check {
    # the standard grpc.health.v1 service every ingestor serves; 0 is gRPC status OK
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

resource "aws_lb_listener" "https" {
  load_balancer_arn = aws_lb.ingest.arn
  port              = 443
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

resource "aws_lb_listener_rule" "ingest_http" {
  listener_arn = aws_lb_listener.https.arn
  priority     = 10

  condition {
    path_pattern {
      values = local.ingest_http_paths
    }
  }

  action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.http.arn
  }
}

resource "aws_lb_listener" "grpc" {
  load_balancer_arn = aws_lb.ingest.arn
  port              = local.grpc_port
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

resource "aws_lb_listener_rule" "ingest_grpc" {
  listener_arn = aws_lb_listener.grpc.arn
  priority     = 10

  condition {
    path_pattern {
      values = local.ingest_grpc_paths
    }
  }

  action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.grpc.arn
  }
}
