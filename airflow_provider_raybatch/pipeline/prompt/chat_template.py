"""The chat-template stage's UDF: Ray Data LLM's, one row at a time, so that one row cannot fail the job.

Imported only where Ray Data LLM is (the job's driver, which swaps it in, and the stage's actors).

Ray Data LLM's ``ChatTemplateUDF`` renders a batch's conversations in one loop: a single conversation
that the model's template rejects (roles that do not alternate, a system message on a template
without one, a content part it cannot render) raises out of the stage and fails the whole job. Here
each row is rendered on its own, and a row that fails comes out with ray.data.llm's error column set
(``chat template failed: ...``), which the later stages pass by and the replica stages as an error
row. Two more differences, both from how our rows travel (:func:`.row_steps.engine_request`):
``messages`` arrives as JSON text, and a row whose preprocess gave a ``prompt`` instead of
``messages`` keeps that prompt as it is, as Ray Data LLM does with its chat template off.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from ray.llm._internal.batch.stages.chat_template_stage import ChatTemplateUDF

from airflow_provider_raybatch.pipeline.row_marks import INFERENCE_ERROR, ROW_REASON_MARK
from airflow_provider_raybatch.shared.json_types import CellValue, JsonObject, Row

CHAT_TEMPLATE_FAILED = "chat template failed"


def conversation_of(messages: CellValue) -> list[JsonObject]:
    """The row's messages as the list of dicts a chat template takes."""
    if isinstance(messages, str):
        return json.loads(messages)
    if hasattr(messages, "tolist"):
        return messages.tolist()
    return list(messages)


class RaybatchChatTemplateUDF(ChatTemplateUDF):
    """Ray Data LLM's chat-template UDF, row by row (see the module docstring)."""

    async def udf(self, batch: list[Row]) -> AsyncIterator[Row]:
        for row in batch:
            index = row[self.IDX_IN_BATCH_COLUMN]
            if row.get("messages") is None:  # the row's own prompt (a preprocess returned 'prompt')
                yield {self.IDX_IN_BATCH_COLUMN: index, "prompt": row.get("prompt"), INFERENCE_ERROR: ""}
                continue
            try:
                prompt = self._render(conversation_of(row["messages"]))
            except Exception as err:  # noqa: BLE001 - this row's conversation, not the job's
                reason = f"{ROW_REASON_MARK}{CHAT_TEMPLATE_FAILED}: {type(err).__name__}: {err}"
                yield {self.IDX_IN_BATCH_COLUMN: index, "prompt": "", INFERENCE_ERROR: reason}
                continue
            # "" on a good row, never missing: in a block where another row failed, Arrow would give
            # this one None, which Ray Data LLM's later stages take for a failure.
            yield {self.IDX_IN_BATCH_COLUMN: index, "prompt": prompt, INFERENCE_ERROR: ""}

    def _render(self, conversation: list[JsonObject]) -> str:
        """What Ray Data LLM's loop does for one conversation (Ray 2.57 and 2.60)."""
        add_generation_prompt = bool(conversation) and conversation[-1].get("role") == "user"
        return self.processor.apply_chat_template(
            conversation,
            tokenize=False,
            chat_template=getattr(self, "chat_template", None),
            add_generation_prompt=add_generation_prompt,
            # If we don't add a generation prompt, the model continues the final (assistant) message.
            continue_final_message=not add_generation_prompt,
            **(getattr(self, "chat_template_kwargs", None) or {}),
        )
