"""Report: the job's progress while it runs, and the run report written with each version."""
