"""The job layer: how a batch becomes a Ray job and how a task finds its own again.

What the operator (operators/) and common.ai's adapter (common_ai/) both do with a job: ship it
(job_shipping.py: its code, spec, S3 settings and submit request), tell its tries apart
(task_tries.py), sign its ids with the deployment's secret (deployment_secret.py), and read the
manifest it committed (committed_manifest.py). Over the hook (hooks/) and the shared layer (shared/);
it imports neither the operators nor the adapter, nor the pipeline.
"""
