"""Tests of the deployment files: docker/, deploy/kuberay/ and scripts/lint_deploy.sh."""
