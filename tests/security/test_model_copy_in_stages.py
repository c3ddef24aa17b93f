"""Every stage that loads a fetched model copy checks it first, not the engine's alone.

Ray Data LLM's chat-template, tokenize and detokenize stages load the processor or tokenizer from the
same path as the engine (the copy the driver fetched into ``model_cache_dir``), with the engine's
``trust_remote_code``; so does a warm replica at a later attach that brings a new chat template. On a
node where the copy is missing (one that joined after the fetch, or after a tmp cleaner), another local
user can make that path first in a shared sticky ``model_cache_dir``: the tokenizer's ``auto_map`` then
runs their Python as the Ray user, in the job's stage actor.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.pipeline.ray_env import run_in_ray_env

pytestmark = pytest.mark.usefixtures("usual_umask")  # tests/security/conftest.py

_PLANTED_COPY = """
import json, os
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_MODULES_CACHE"] = os.path.join(SHARED, "own-hf-modules")
from airflow_provider_raybatch.pipeline.generate.stage_swap import StageSwap, swap_stages
from ray.llm._internal.batch.stages import ChatTemplateStage, DetokenizeStage, TokenizeStage

cache = os.path.join(SHARED, "raybatch-models")
copy = os.path.join(cache, "tiny-0123456789abcdef", "0123456789abcdef")
os.makedirs(copy)
ran = os.path.join(SHARED, "planted-code-ran")
with open(os.path.join(copy, "evil_tok.py"), "w") as sink:
    sink.write("from transformers import PreTrainedTokenizer\\nclass EvilTok(PreTrainedTokenizer):\\n"
               f"    def __init__(self, *args, **kwargs):\\n        open({ran!r}, 'w').close()\\n")
with open(os.path.join(copy, "tokenizer_config.json"), "w") as sink:
    json.dump({"auto_map": {"AutoTokenizer": ["evil_tok.EvilTok", None]}, "tokenizer_class": "EvilTok"}, sink)
with open(os.path.join(copy, "config.json"), "w") as sink:
    json.dump({"model_type": "gpt2"}, sink)
for folder, _, files in os.walk(cache):  # another local user made the copy's path on this node
    for path in [folder, *(os.path.join(folder, name) for name in files)]:
        os.chown(path, 12345, 12345)
"""

_STAGES_ON_A_PLANTED_COPY = """
kwargs = {"model": copy, "trust_remote_code": True}
stages = {"ChatTemplateStage": ChatTemplateStage(fn_constructor_kwargs=dict(kwargs), map_batches_kwargs={}),
          "TokenizeStage": TokenizeStage(fn_constructor_kwargs=dict(kwargs), map_batches_kwargs={}),
          "DetokenizeStage": DetokenizeStage(fn_constructor_kwargs=dict(kwargs), map_batches_kwargs={})}
swap_stages(stages, StageSwap({}, os.path.join(SHARED, "compile"), model_copy_root=cache))

report = {}
for name, stage in stages.items():
    try:
        stage.fn(data_column="__data", expected_input_keys=[], **stage.fn_constructor_kwargs)
        refused = None
    except Exception as err:
        refused = f"{type(err).__name__}: {err}"
    report[name] = {"code_ran": os.path.exists(ran), "refused": refused}
    if os.path.exists(ran):
        os.remove(ran)
print(json.dumps(report))
"""


@pytest.mark.timeout(300)
def test_no_stage_loads_a_model_copy_another_user_made(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)

    report = run_in_ray_env(f"SHARED = {str(shared)!r}\n{_PLANTED_COPY}{_STAGES_ON_A_PLANTED_COPY}")

    for stage, result in report.items():
        assert not result["code_ran"], (stage, result)
        assert "owned by uid 12345" in (result["refused"] or ""), (stage, result)


_DRY_RUN_COUNTER_ON_A_PLANTED_COPY = """
from airflow_provider_raybatch.pipeline.dry_run import PromptTokenCounter
try:
    PromptTokenCounter(copy, None, model_copy_root=cache)
    refused = None
except Exception as err:
    refused = f"{type(err).__name__}: {err}"
print(json.dumps({"code_ran": os.path.exists(ran), "refused": refused}))
"""


@pytest.mark.timeout(300)
def test_the_dry_runs_token_counter_checks_the_model_copy(tmp_path: Path) -> None:
    """The dry run's counter loads the copy's tokenizer and chat template without remote code, so a
    planted copy runs nothing there; it would still count with another user's tokenizer."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)

    report = run_in_ray_env(f"SHARED = {str(shared)!r}\n{_PLANTED_COPY}{_DRY_RUN_COUNTER_ON_A_PLANTED_COPY}")

    assert not report["code_ran"], report
    assert "owned by uid 12345" in (report["refused"] or ""), report
