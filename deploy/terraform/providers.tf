# Used as a root module (`terraform apply` in this directory) this configures AWS; when you
# call the directory as a child module instead, delete this file and pass your provider.
provider "aws" {
  region = var.aws_region

  default_tags {
    tags = merge({ "app" = var.name, "managed-by" = "terraform" }, var.tags)
  }
}
