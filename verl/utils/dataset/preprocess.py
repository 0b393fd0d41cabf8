"""Row builders and I/O shared by ``examples/data_preprocess/*.py``: source records (HF datasets or local JSONL)
-> rows in upstream verl's RL parquet format.

Each builder returns one row with the columns ``data_source``, ``prompt`` (chat messages), ``ability``,
``reward_model`` (``{"style": "rule", "ground_truth": ...}``) and ``extra_info`` (plus ``images`` for geo3k),
exactly the columns ``RLHFDataset`` and ``default_compute_score`` read.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from verl.utils.reward_score.math_reward import last_boxed_only_string, remove_boxed

GSM8K_SOURCE = "openai/gsm8k"
# The shipped 64 + 16 problem sample is in GSM8K's format but is not GSM8K: its own label keeps a validation score
# on it from being read (or compared) as a GSM8K score. Scored by the same gsm8k rule.
GSM8K_SAMPLE_SOURCE = "verl_sample/gsm8k_format"
MATH_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
GEO3K_SOURCE = "hiyouga/geometry3k"
AIME_SOURCE = "aime2024"
DAPO_MATH_SOURCE = "math_dapo"
# Named training sets for the AIME recipe: name -> (HF dataset, split). Their rows are scored by math_dapo too.
AIME_TRAIN_SETS = {"dapo_math": ("BytedTsinghua-SIA/DAPO-Math-17k", "train")}

# Instructions appended to the question. The gsm8k and MATH ones are upstream's exact wording (models trained with
# upstream recipes expect them); the geo3k and AIME ones state the same output contract in our own words.
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
GEO3K_INSTRUCTION = (
    "First reason step by step inside <think> </think> tags, then give the final answer inside \\boxed{}."
)
AIME_INSTRUCTION = (
    "Solve the problem step by step. The last line of your response must have the form 'Answer: <answer>', where "
    "<answer> is the final answer."
)
_GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def _field(example: dict, names: tuple[str, ...], where: str) -> Any:
    """The first of ``names`` present in ``example``; KeyError naming the record and the accepted names."""
    for name in names:
        if name in example and example[name] is not None:
            return example[name]
    raise KeyError(f"{where}: none of the fields {list(names)} found; fields present: {sorted(example)}")


def user_prompt(text: str) -> list[dict]:
    """A one-turn chat prompt."""
    return [{"role": "user", "content": text}]


def extract_gsm8k_answer(answer: str, where: str = "record") -> str:
    """The number after ``####`` in a GSM8K solution, commas removed; ValueError when there is none."""
    match = _GSM8K_ANSWER.search(answer)
    if match is None:
        raise ValueError(f"{where}: GSM8K answer has no '#### <number>' line: {answer[-80:]!r}")
    return match.group(1).replace(",", "")


def gsm8k_row(example: dict, index: int, split: str, data_source: str = GSM8K_SOURCE) -> dict:
    """GSM8K ``{question, answer}`` -> RL row (ground truth = the number after ``####``); ``data_source`` is
    ``openai/gsm8k`` for the real dataset, :data:`GSM8K_SAMPLE_SOURCE` for the shipped sample."""
    where = f"{split} record {index}"
    question, answer = _field(example, ("question",), where), _field(example, ("answer",), where)
    return {
        "data_source": data_source,
        "prompt": user_prompt(f"{question} {GSM8K_INSTRUCTION}"),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_gsm8k_answer(answer, where)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def math_row(example: dict, index: int, split: str) -> dict:
    """MATH ``{problem, solution}`` -> RL row (ground truth = the solution's last ``\\boxed{}``)."""
    where = f"{split} record {index}"
    problem, solution = _field(example, ("problem",), where), _field(example, ("solution",), where)
    boxed = last_boxed_only_string(solution)
    if boxed is None:
        raise ValueError(f"{where}: MATH solution has no \\boxed{{}} answer: {solution[-80:]!r}")
    return {
        "data_source": MATH_SOURCE,
        "prompt": user_prompt(f"{problem} {MATH_INSTRUCTION}"),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": remove_boxed(boxed)},
        "extra_info": {"split": split, "index": index},
    }


def encode_image(image: Any, base_dir: str = ".") -> dict:
    """An image as the ``{"bytes", "path"}`` struct of HF ``datasets`` (what RLHFDataset decodes).

    Accepts such a dict, raw bytes, a PIL image (saved as PNG) or a file path (relative to ``base_dir``).
    """
    if isinstance(image, dict) and "bytes" in image:
        return {"bytes": image["bytes"], "path": image.get("path")}
    if isinstance(image, (bytes, bytearray)):
        return {"bytes": bytes(image), "path": None}
    if isinstance(image, str):
        path = image if os.path.isabs(image) else os.path.join(base_dir, image)
        with open(path, "rb") as f:
            return {"bytes": f.read(), "path": os.path.basename(path)}
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")  # a PIL image
    return {"bytes": buffer.getvalue(), "path": None}


def geo3k_row(example: dict, index: int, split: str, base_dir: str = ".") -> dict:
    """Geometry3K ``{problem, answer, images}`` -> RL row; the problem text keeps its ``<image>`` placeholders."""
    where = f"{split} record {index}"
    problem, answer = _field(example, ("problem",), where), _field(example, ("answer",), where)
    images = example.get("images") or []
    return {
        "data_source": GEO3K_SOURCE,
        "prompt": user_prompt(f"{problem} {GEO3K_INSTRUCTION}"),
        "images": [encode_image(image, base_dir) for image in images],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "answer": str(answer), "question": problem},
    }


def aime_row(example: dict, index: int, split: str, data_source: str = AIME_SOURCE) -> dict:
    """AIME ``{problem|Problem|question, answer|Answer}`` -> RL row scored by ``math_dapo`` (data_source aime*)."""
    where = f"{split} record {index}"
    problem = _field(example, ("problem", "Problem", "question"), where)
    answer = _field(example, ("answer", "Answer"), where)
    return {
        "data_source": data_source,
        "prompt": user_prompt(f"{AIME_INSTRUCTION}\n\n{problem}"),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "question": problem},
    }


def dapo_math_row(example: dict, index: int, split: str) -> dict:
    """A DAPO-Math-17k record -> RL row scored by ``math_dapo``.

    Records as published are already RL rows (``prompt`` chat messages that carry the ``Answer:`` instruction,
    ``reward_model.ground_truth``); their prompt is kept. Plain ``{problem, answer}`` records get the AIME
    instruction, like :func:`aime_row`.
    """
    where = f"{split} record {index}"
    if isinstance(example.get("prompt"), list) and isinstance(example.get("reward_model"), dict):
        prompt, answer = example["prompt"], _field(example["reward_model"], ("ground_truth",), where)
    else:
        problem = _field(example, ("problem", "Problem", "question"), where)
        prompt, answer = user_prompt(f"{AIME_INSTRUCTION}\n\n{problem}"), _field(example, ("answer", "Answer"), where)
    return {
        "data_source": DAPO_MATH_SOURCE,
        "prompt": [{"role": m["role"], "content": m["content"]} for m in prompt],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index},
    }


def read_jsonl(path: str) -> list[dict]:
    """Records of a JSON-lines file (blank lines skipped); errors name the file and line."""
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--input_jsonl: {path!r} does not exist")
    records = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path} line {line_number}: not valid JSON ({exc})") from exc
    return records


def build_rows(records: Iterable[dict], split: str, row_fn: Callable[..., dict], **kwargs: Any) -> list[dict]:
    """``row_fn(record, index, split, **kwargs)`` for every record, indexed from 0."""
    return [row_fn(record, index, split, **kwargs) for index, record in enumerate(records)]


def write_parquet(rows: list[dict], path: str) -> str:
    """Write rows to ``path`` (parent directories created); returns the path."""
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
