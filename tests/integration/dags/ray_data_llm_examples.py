"""Row functions written as Ray Data LLM's public documentation writes them, pasted unchanged.

A user moving a working Ray Data LLM notebook into a DAG pastes these; the pipeline must give the
same results. Sources (Ray's docs, "Working with LLMs" and the batch examples), as of Ray 2.60:

* the quickstart's preprocess (system + user messages, per-row ``sampling_params``) and its
  postprocess ``dict(answer=row["generated_text"], **row)`` that keeps every column;
* the structured-output example: per-row ``structured_outputs`` (a ``choice`` constraint and a JSON
  schema) set in preprocess;
* the vision example: a ``{"type": "image", "image": ...}`` content part beside the text, the image
  given as a PIL image, bytes, a data URL or a path/URL.

Only module-level functions: the pipeline ships this module to the cluster and imports them by name.
"""

from __future__ import annotations

import base64
import io

INDUSTRIES = ["Law Firm", "Healthcare", "Retail", "Software", "Other"]
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "confidence": {"anyOf": [{"type": "string", "enum": ["low", "high"]}, {"type": "null"}]},
    },
    "required": ["answer"],
}


def haiku_preprocess(row):
    return dict(
        messages=[
            {"role": "system", "content": "You are a bot that responds with haikus."},
            {"role": "user", "content": row["item"]},
        ],
        sampling_params=dict(
            temperature=0.3,
            max_tokens=12,
        ),
    )


def haiku_postprocess(row):
    return dict(
        answer=row["generated_text"],
        **row,  # This will return all the original columns in the dataset.
    )


def industry_preprocess(row):
    """Company -> industry, constrained to the labels with a per-row choice (structured outputs)."""
    return dict(
        messages=[
            {"role": "system", "content": "Classify the company's industry. Answer with the label only."},
            {"role": "user", "content": f"What industry is {row['Company']} in?"},
        ],
        sampling_params=dict(
            temperature=0,
            max_tokens=8,
            structured_outputs=dict(choice=INDUSTRIES),
        ),
        Company=row["Company"],
    )


def industry_postprocess(row):
    return dict(company=row["Company"], industry=row["generated_text"])


def json_answer_preprocess(row):
    """A per-row JSON schema whose branches differ (enum on one, null on the other)."""
    return dict(
        prompt=f"Question: {row['question']}\nAnswer in JSON:",
        sampling_params=dict(max_tokens=24, structured_outputs=dict(json=ANSWER_SCHEMA)),
    )


def json_answer_postprocess(row):
    return dict(question_prompt=row["prompt"], raw=row["generated_text"], tokens=row["num_generated_tokens"])


def vision_preprocess(row):
    """The vision example's shape: the image as the row holds it (PIL, bytes, a data URL or a path)."""
    image = row["image"]
    if isinstance(image, dict) and "bytes" in image:  # a Hugging Face image struct read from Parquet
        image = image["bytes"]
    if isinstance(image, str) and image.startswith("data:application/octet-stream;base64,"):
        from PIL import Image

        image = Image.open(io.BytesIO(base64.b64decode(image.split(",", 1)[1])))
    return dict(
        messages=[
            {"role": "system", "content": "You are an assistant that describes images."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe this image in one sentence."},
                    {"type": "image", "image": image},
                ],
            },
        ],
        sampling_params=dict(temperature=0.3, max_tokens=8),
    )


def vision_postprocess(row):
    return dict(resp=row["generated_text"], **row)
