"""The OpenAI Batch API endpoints a batch file may target: the Batch API plugin checks a batch's
endpoint against them, and the pipeline (``pipeline/openai/openai_batch.py``) turns each one's
requests into rows and its rows back into responses."""

from __future__ import annotations

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
