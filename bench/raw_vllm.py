"""(a) The baseline: the same batch with raw vLLM ``LLM.generate`` in one plain process.

Reads the job spec our operator builds (bench/compare.py writes it), so the model, engine
arguments, sampling parameters and prompts are exactly the pipeline's: each row's chat messages come
from the pipeline's own ``build_messages``, the chat template and tokenizer are applied as Ray Data
LLM's chat-template and tokenize stages do, and ``LLM.generate`` gets the token ids. Outputs are
written as one Parquet file (id, generated_text, token counts), then a JSON result with wall-clock
timestamps (``time.time()``) so the caller can line them up with its own.

usage: python bench/raw_vllm.py SPEC_JSON_FILE OUT_DIR      (run with the Ray/vLLM environment)
"""

from __future__ import annotations

import time

T_PROCESS = time.time()  # as early as possible: "from process start" is measured from here too

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the provider's spec and prompt code; the Ray env does not install it


def main() -> None:
    spec_file, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    from airflow_provider_raybatch.pipeline.prompts import build_messages
    from airflow_provider_raybatch.specs import BatchInferenceSpec

    spec = BatchInferenceSpec.from_json(spec_file.read_text())
    rows = [json.loads(line) for line in Path(spec.input_uri).read_text().splitlines() if line.strip()]
    conversations = [build_messages(spec, row) for row in rows]
    ids = [str(row[spec.id_column]) for row in rows]

    t_import = time.time()
    from vllm import LLM, SamplingParams

    t_engine = time.time()
    llm = LLM(model=spec.model, **spec.engine_kwargs)
    t_ready = time.time()
    tokenizer = llm.get_tokenizer()
    # As Ray Data LLM's ChatTemplateStage and TokenizeStage do: template to text, then tokenize.
    texts = [
        tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations
    ]
    prompts = [{"prompt_token_ids": ids_} for ids_ in tokenizer(texts)["input_ids"]]
    sampling = SamplingParams(**spec.sampling_params)
    t_gen = time.time()
    outputs = llm.generate(prompts, sampling, use_tqdm=False)
    t_gen_end = time.time()

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(
        [
            {
                spec.id_column: row_id,
                "generated_text": out.outputs[0].text,
                "num_input_tokens": len(out.prompt_token_ids),
                "num_generated_tokens": len(out.outputs[0].token_ids),
            }
            for row_id, out in zip(ids, outputs, strict=True)
        ]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out_dir / "outputs.parquet")
    t_written = time.time()
    result = {
        "t_process": T_PROCESS,
        "t_import_vllm": t_import,
        "t_engine_start": t_engine,
        "t_engine_ready": t_ready,
        "t_generate_start": t_gen,
        "t_generate_end": t_gen_end,
        "t_outputs_written": t_written,
        "rows": len(outputs),
        "tokens_in": sum(len(o.prompt_token_ids) for o in outputs),
        "tokens_out": sum(len(o.outputs[0].token_ids) for o in outputs),
        "torch_threads": _torch_threads(),
        "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    (out_dir / "raw_result.json").write_text(json.dumps(result, indent=1))
    print("RAW_RESULT " + json.dumps(result), flush=True)


def _torch_threads() -> int | None:
    try:
        import torch

        return torch.get_num_threads()
    except Exception:  # noqa: BLE001 - informational only
        return None


if __name__ == "__main__":
    main()
