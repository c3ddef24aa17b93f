"""Tests of airflow_provider_raybatch/pipeline/prompt/chat_template.py: the chat-template stage renders row by
row, so that a conversation the model's template rejects fails that row only.

Run in the cluster's environment (Ray Data LLM's UDF is the base class), with a stand-in processor
whose template rejects two roles in a row, as many real templates do.
"""

from __future__ import annotations

from tests.unit.pipeline.ray_env import run_in_ray_env

_RUN = r"""
import asyncio, json
from airflow_provider_raybatch.pipeline.prompt.chat_template import RaybatchChatTemplateUDF

class Template:
    def apply_chat_template(
        self, conversation, tokenize, chat_template, add_generation_prompt, continue_final_message
    ):
        roles = [m["role"] for m in conversation]
        if any(a == b for a, b in zip(roles, roles[1:])):
            raise ValueError("Conversation roles must alternate user/assistant/user/assistant/...")
        text = "".join(f"<{m['role']}>{m['content']}" for m in conversation)
        return text + ("<assistant>" if add_generation_prompt else "")

udf = RaybatchChatTemplateUDF.__new__(RaybatchChatTemplateUDF)
udf.processor, udf.chat_template = Template(), None
index = RaybatchChatTemplateUDF.IDX_IN_BATCH_COLUMN
batch = [
    {index: 0, "messages": json.dumps([{"role": "user", "content": "hi"}]), "prompt": None},
    {index: 1, "messages": json.dumps([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
     "prompt": None},
    {index: 2, "messages": None, "prompt": "a ready prompt"},
    {index: 3, "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "prefill"}],
     "prompt": None},
]

async def main():
    return [out async for out in udf.udf(batch)]

print(json.dumps(asyncio.run(main())))
"""


def test_a_rejected_conversation_fails_its_row_and_the_others_render() -> None:
    rows = sorted(run_in_ray_env(_RUN), key=lambda row: row["__idx_in_batch"])

    assert [row["prompt"] for row in rows] == [
        "<user>hi<assistant>",
        "",
        "a ready prompt",
        "<user>q<assistant>prefill",
    ]
    assert rows[1]["__inference_error__"].startswith(
        "raybatch row error: chat template failed: ValueError: Conversation roles must alternate"
    )
    assert [rows[i]["__inference_error__"] for i in (0, 2, 3)] == ["", "", ""]  # good rows: "", never None
