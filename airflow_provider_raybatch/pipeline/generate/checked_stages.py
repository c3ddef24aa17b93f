"""Ray Data LLM's stages that load the model's tokenizer or processor (chat template, tokenize,
detokenize), checking a model copy the driver fetched before they load from it.

The engine replica checks the copy on its node before its engine loads it
(:func:`.models.check_copy_in_replica`); these stages load from the same path, with the engine's
``trust_remote_code``, in actors of their own that may run on another node. A copy missing there (a
node that joined after the fetch, a tmp cleaner) could have been made by another local user, whose
tokenizer code would then run as the Ray user. Each stage checks it as the replica does.
"""

from __future__ import annotations

from ray.llm._internal.batch.stages.tokenize_stage import DetokenizeUDF, TokenizeUDF

from airflow_provider_raybatch.pipeline.generate import models
from airflow_provider_raybatch.pipeline.prompt.chat_template import RaybatchChatTemplateUDF
from airflow_provider_raybatch.shared.json_types import ArgValue

MODEL_COPY_KWARG = models.MODEL_COPY_KWARG


class _ChecksModelCopy:
    """Before the stage's own constructor loads anything: check the copy it names (``model``)."""

    def __init__(
        self, *args: ArgValue, raybatch_model_copy_root: str | None = None, **kwargs: ArgValue
    ) -> None:
        if raybatch_model_copy_root is not None:
            models.check_copy_in_replica(str(kwargs.get("model")), raybatch_model_copy_root)
        super().__init__(*args, **kwargs)


class CheckedChatTemplateUDF(_ChecksModelCopy, RaybatchChatTemplateUDF):
    """Our chat-template UDF (row by row), checking the model copy first."""


class CheckedTokenizeUDF(_ChecksModelCopy, TokenizeUDF):
    """Ray Data LLM's tokenize UDF, checking the model copy first."""


class CheckedDetokenizeUDF(_ChecksModelCopy, DetokenizeUDF):
    """Ray Data LLM's detokenize UDF, checking the model copy first."""


#: Each stage UDF that loads from the model's path, and the checking one that stands in for it.
CHECKED = {
    RaybatchChatTemplateUDF: CheckedChatTemplateUDF,
    TokenizeUDF: CheckedTokenizeUDF,
    DetokenizeUDF: CheckedDetokenizeUDF,
}
