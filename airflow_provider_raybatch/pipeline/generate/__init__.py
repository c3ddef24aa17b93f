"""Generate: the model, Ray Data LLM's processor and our engine replica around vLLM.

:mod:`.processor` builds the processor in the driver without importing vLLM, with our UDFs in Ray
Data LLM's stages (:mod:`.stage_swap`); :mod:`.engine_actor` is the replica (Ray Data LLM's own UDF,
plus staging as rows finish); :mod:`.engine` is the replica's runtime (its faster start, its
restarts, its errors); :mod:`.engine_pool` keeps replicas warm between jobs; :mod:`.models` resolves
where the weights come from.
"""
