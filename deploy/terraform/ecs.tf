# Compute: ECS on Fargate. Ingestors are a load-balanced service (the ALB, and the Kafka
# NLB with enable_kafka) scaled on CPU by
# Application Auto Scaling; the collector is a service of exactly one task; the admin API is
# a service of admin_count (0 or 1) tasks with its own role.

resource "aws_ecr_repository" "icefloe" {
  name                 = var.name
  image_tag_mutability = "IMMUTABLE"

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "KMS"
    kms_key         = aws_kms_key.icefloe.arn
  }
}

resource "aws_cloudwatch_log_group" "ingestor" {
  name              = "/${var.name}/ingestor"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.icefloe.arn
}

resource "aws_cloudwatch_log_group" "collector" {
  name              = "/${var.name}/collector"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.icefloe.arn
}

resource "aws_cloudwatch_log_group" "admin" {
  name              = "/${var.name}/admin"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.icefloe.arn
}

resource "aws_cloudwatch_log_group" "ecs_exec" {
  name              = "/${var.name}/ecs-exec"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.icefloe.arn
}

resource "aws_ecs_cluster" "icefloe" {
  name = var.name

  setting {
    name  = "containerInsights"
    value = "enabled"
  }

  configuration {
    execute_command_configuration {
      kms_key_id = aws_kms_key.icefloe.arn
      logging    = "OVERRIDE"
      log_configuration {
        cloud_watch_encryption_enabled = true
        cloud_watch_log_group_name     = aws_cloudwatch_log_group.ecs_exec.name
      }
    }
  }
}

# --- ingestors ----------------------------------------------------------------------

resource "aws_ecs_task_definition" "ingestor" {
  family                   = "${var.name}-ingestor"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.ingestor_cpu
  memory                   = var.ingestor_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.ingestor.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  volume {
    name = "tmp"
  }

  container_definitions = jsonencode([
    {
      name                   = "ingestor"
      image                  = local.image
      essential              = true
      command                = local.ingestor_command
      user                   = "10001:10001"
      readonlyRootFilesystem = true
      privileged             = false
      portMappings = concat([
        { name = "http", containerPort = local.http_port, protocol = "tcp" },
        { name = "grpc", containerPort = local.grpc_port, protocol = "tcp", appProtocol = "grpc" },
        ], var.enable_kafka ? [
        { name = "kafka", containerPort = local.kafka_port, protocol = "tcp" },
        ] : [], var.enable_otlp ? [
        { name = "otlp-http", containerPort = local.otlp_http_port, protocol = "tcp" },
        { name = "otlp-grpc", containerPort = local.otlp_grpc_port, protocol = "tcp", appProtocol = "grpc" },
      ] : [])
      environment = concat(local.environment_common, local.environment_ingestor,
        var.enable_kafka ? local.environment_kafka : [],
      var.enable_otlp ? concat(local.environment_otlp, local.environment_otlp_ports) : [])
      secrets     = local.config_secret
      mountPoints = [{ sourceVolume = "tmp", containerPath = "/tmp", readOnly = false }]
      linuxParameters = {
        capabilities = { drop = ["ALL"] }
      }
      healthCheck = {
        command     = ["CMD", "icefloe-healthcheck", "ingestor", "/healthz"]
        interval    = 15
        timeout     = 5
        retries     = 3
        startPeriod = 30
      }
      # SIGTERM drains: the servers finish requests in flight (up to [ingestor]
      # shutdown_timeout_s, 20 s), then the buffer flushes (up to shutdown_timeout_s or a
      # flush already under way, flush_timeout_s: 30 s): 50 s at most, plus a margin
      # (Fargate allows up to 120)
      stopTimeout = 60
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          "awslogs-group"         = aws_cloudwatch_log_group.ingestor.name
          "awslogs-region"        = var.aws_region
          "awslogs-stream-prefix" = "ingestor"
        }
      }
    },
  ])
}

resource "aws_ecs_service" "ingestor" {
  name                               = "${var.name}-ingestor"
  cluster                            = aws_ecs_cluster.icefloe.id
  task_definition                    = aws_ecs_task_definition.ingestor.arn
  launch_type                        = "FARGATE"
  platform_version                   = "LATEST"
  desired_count                      = var.ingestor_min_count
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200
  health_check_grace_period_seconds  = 60
  enable_execute_command             = false
  propagate_tags                     = "SERVICE"

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.ingestor.id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.http.arn
    container_name   = "ingestor"
    container_port   = local.http_port
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.grpc.arn
    container_name   = "ingestor"
    container_port   = local.grpc_port
  }

  dynamic "load_balancer" {
    for_each = var.enable_kafka ? [1] : []
    content {
      target_group_arn = aws_lb_target_group.kafka[0].arn
      container_name   = "ingestor"
      container_port   = local.kafka_port
    }
  }

  dynamic "load_balancer" {
    for_each = var.enable_otlp ? [1] : []
    content {
      target_group_arn = aws_lb_target_group.otlp_http[0].arn
      container_name   = "ingestor"
      container_port   = local.otlp_http_port
    }
  }

  dynamic "load_balancer" {
    for_each = var.enable_otlp ? [1] : []
    content {
      target_group_arn = aws_lb_target_group.otlp_grpc[0].arn
      container_name   = "ingestor"
      container_port   = local.otlp_grpc_port
    }
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  lifecycle {
    # the autoscaler owns the task count after the first apply
    ignore_changes = [desired_count]
  }

  # every listener forwarding to a target group above: ECS refuses to register targets in a
  # group no listener uses yet (the conditional ones are empty lists when switched off)
  depends_on = [
    aws_lb_listener.https,
    aws_lb_listener.grpc,
    aws_lb_listener.kafka,
    aws_lb_listener.otlp_http,
    aws_lb_listener.otlp_grpc,
  ]
}

resource "aws_appautoscaling_target" "ingestor" {
  service_namespace  = "ecs"
  resource_id        = "service/${aws_ecs_cluster.icefloe.name}/${aws_ecs_service.ingestor.name}"
  scalable_dimension = "ecs:service:DesiredCount"
  min_capacity       = var.ingestor_min_count
  max_capacity       = var.ingestor_max_count
}

resource "aws_appautoscaling_policy" "ingestor_cpu" {
  name               = "${var.name}-ingestor-cpu"
  service_namespace  = aws_appautoscaling_target.ingestor.service_namespace
  resource_id        = aws_appautoscaling_target.ingestor.resource_id
  scalable_dimension = aws_appautoscaling_target.ingestor.scalable_dimension
  policy_type        = "TargetTrackingScaling"

  target_tracking_scaling_policy_configuration {
    target_value       = var.ingestor_cpu_target
    scale_out_cooldown = 60
    # scale in slowly: each stopped ingestor drains its buffer first
    scale_in_cooldown = 300

    predefined_metric_specification {
      predefined_metric_type = "ECSServiceAverageCPUUtilization"
    }
  }
}

# --- the collector ------------------------------------------------------------------
# desired_count is 1 and is never scaled. Who commits is decided by the manifest lease, not
# by ECS: during a deployment the new task starts as a hot standby (maximum_percent 200), the
# old one stops on SIGTERM after its current run, and the new one takes over the lease.
# Taking over bumps the manifest epoch, which fences the old task, so an overlap (or a task
# ECS lost track of) can never commit twice.

resource "aws_ecs_task_definition" "collector" {
  family                   = "${var.name}-collector"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.collector_cpu
  memory                   = var.collector_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.collector.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  ephemeral_storage {
    size_in_gib = var.collector_ephemeral_storage_gib
  }

  volume {
    name = "tmp"
  }

  container_definitions = jsonencode([
    {
      name                   = "collector"
      image                  = local.image
      essential              = true
      command                = local.collector_command
      user                   = "10001:10001"
      readonlyRootFilesystem = true
      privileged             = false
      portMappings = [
        { name = "metrics", containerPort = local.metrics_port, protocol = "tcp" },
      ]
      environment = concat(local.environment_common, local.environment_collector,
      var.enable_otlp ? local.environment_otlp : [])
      secrets     = concat(local.config_secret, local.catalog_secret)
      mountPoints = [{ sourceVolume = "tmp", containerPath = "/tmp", readOnly = false }]
      linuxParameters = {
        capabilities = { drop = ["ALL"] }
      }
      healthCheck = {
        command     = ["CMD", "icefloe-healthcheck", "collector", "/healthz"]
        interval    = 15
        timeout     = 5
        retries     = 4
        startPeriod = 120
      }
      # a stop finishes the current run (Fargate allows at most 120 s)
      stopTimeout = 120
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          "awslogs-group"         = aws_cloudwatch_log_group.collector.name
          "awslogs-region"        = var.aws_region
          "awslogs-stream-prefix" = "collector"
        }
      }
    },
  ])
}

resource "aws_ecs_service" "collector" {
  name                               = "${var.name}-collector"
  cluster                            = aws_ecs_cluster.icefloe.id
  task_definition                    = aws_ecs_task_definition.collector.arn
  launch_type                        = "FARGATE"
  platform_version                   = "LATEST"
  desired_count                      = 1
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200
  enable_execute_command             = false
  propagate_tags                     = "SERVICE"

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.collector.id]
    assign_public_ip = false
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }
}

# --- the admin API --------------------------------------------------------------------
# Off until the config holds [admin] tokens (it refuses to start without them). No load
# balancer: it is reached from admin_allowed_cidr_blocks inside the VPC.

resource "aws_ecs_task_definition" "admin" {
  family                   = "${var.name}-admin"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = 256
  memory                   = 512
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.admin.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  volume {
    name = "tmp"
  }

  container_definitions = jsonencode([
    {
      name                   = "admin"
      image                  = local.image
      essential              = true
      command                = local.admin_command
      user                   = "10001:10001"
      readonlyRootFilesystem = true
      privileged             = false
      portMappings = [
        { name = "admin", containerPort = local.admin_port, protocol = "tcp" },
      ]
      environment = concat(local.environment_common, local.environment_admin,
      var.enable_otlp ? local.environment_otlp : [])
      secrets     = concat(local.config_secret, local.catalog_secret)
      mountPoints = [{ sourceVolume = "tmp", containerPath = "/tmp", readOnly = false }]
      linuxParameters = {
        capabilities = { drop = ["ALL"] }
      }
      healthCheck = {
        command     = ["CMD", "icefloe-healthcheck", "admin", "/healthz"]
        interval    = 15
        timeout     = 5
        retries     = 3
        startPeriod = 30
      }
      stopTimeout = 30
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          "awslogs-group"         = aws_cloudwatch_log_group.admin.name
          "awslogs-region"        = var.aws_region
          "awslogs-stream-prefix" = "admin"
        }
      }
    },
  ])
}

resource "aws_ecs_service" "admin" {
  name                               = "${var.name}-admin"
  cluster                            = aws_ecs_cluster.icefloe.id
  task_definition                    = aws_ecs_task_definition.admin.arn
  launch_type                        = "FARGATE"
  platform_version                   = "LATEST"
  desired_count                      = var.admin_count
  deployment_minimum_healthy_percent = 0
  deployment_maximum_percent         = 100
  enable_execute_command             = false
  propagate_tags                     = "SERVICE"

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.admin.id]
    assign_public_ip = false
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }
}
