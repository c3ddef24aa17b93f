"""Stage and commit: finished rows into parts as the replicas go, then one version, manifest last.

A retry resumes from what was staged (:mod:`.commit`); readers see the old version or the new one,
never a mix.
"""
