"""Generate: the model, Ray Data LLM's processor and our engine replica around vLLM.

:mod:`.processor` builds the processor in the driver without importing vLLM; :mod:`.engine_actor`
is the replica (Ray Data LLM's own UDF, plus staging as rows finish); :mod:`.engine` holds the
replica's settings and its faster start; :mod:`.models` resolves where the weights come from.
"""
