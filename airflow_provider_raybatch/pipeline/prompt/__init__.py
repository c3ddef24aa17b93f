"""Prompt: a row's chat messages from the operator's templates, and the model's chat template.

Each row's prompt is built in :func:`..row_steps.prepare_row`; the dry run renders and counts them
with the model's own template (:mod:`.chat_template`).
"""
