"""The dry run's benchmark: a tiny local lm-evaluation-harness task, so ``eval.enabled`` runs without the Hub.

A recipe that evaluates after training names benchmark tasks (``eval.tasks``) whose datasets a cluster reads from
the Hugging Face Hub or a local ``eval.task_dir``; a dry run reaches neither Hub. It writes one multiple-choice task
of its own instead, in the harness's task YAML (``dataset_path: json`` with ``data_files``: the harness's way to a
local dataset), with a handful of arithmetic items: the trained twin scores them by log-likelihood exactly as a real
model scores ARC or HellaSwag, through the same ``hf`` model and the same code path. The score itself means nothing
(a twin of a few thousand weights); that there is one, recorded and shown, is what the dry run proves.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

#: The task's name, as the harness registers it from the YAML.
TASK = "recipekit_dryrun_choice"
#: Items written; the dry run scores ITEMS of them (eval.limit).
ITEMS = 8


def write_tiny_task(directory: Path, seed: int = 0) -> Path:
    """``directory`` holding the task's YAML and its JSON-lines items; returns the directory (the include path)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    lines = []
    for _ in range(ITEMS):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        choices = [str(a + b), str(a + b + 1), str(a * b + 10)]
        answer = rng.randrange(len(choices))
        choices[0], choices[answer] = choices[answer], choices[0]
        lines.append(json.dumps({"question": f"What is {a} plus {b}?", "choices": choices, "answer": answer}))
    items = directory / "items.jsonl"
    items.write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = [
        f"task: {TASK}",
        "dataset_path: json",
        "dataset_kwargs:",
        "  data_files:",
        f"    test: {json.dumps(str(items))}",
        "test_split: test",
        "output_type: multiple_choice",
        'doc_to_text: "{{question}}"',
        'doc_to_choice: "{{choices}}"',
        'doc_to_target: "{{answer}}"',
        "metric_list:",
        "  - metric: acc",
        "    aggregation: mean",
        "    higher_is_better: true",
        "metadata:",
        "  version: 1",
    ]
    (directory / f"{TASK}.yaml").write_text("\n".join(config) + "\n", encoding="utf-8")
    return directory
