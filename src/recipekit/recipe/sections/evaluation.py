"""``eval``: the benchmark run on the trained model after training (lm-evaluation-harness), off by default."""

from __future__ import annotations

from typing import Annotated

from recipekit.recipe.domains import ABSOLUTE_PATH
from recipekit.recipe.schema import Section, pattern_domain, spec

#: The harness a bundle runs: EleutherAI's lm-evaluation-harness (PyPI ``lm_eval``), pinned per image family.
HARNESS = "lm_eval"
#: A task or group name as lm-evaluation-harness registers them (``arc_easy``, ``mmlu_stem``, ``leaderboard_bbh``).
TASK_NAME = pattern_domain(
    "benchmark task",
    "at most 128 letters, digits, '.', '_' and '-', starting with a letter or digit",
    r"[A-Za-z0-9][A-Za-z0-9._-]*",
    max_length=128,
)


class EvalSpec(Section):
    """Evaluation after training: rank 0 runs lm-evaluation-harness on the model the run saved (its output
    directory, or the merged model of ``lora.merge_on_save``), once training is done, and records the scores in
    the output directory (``recipekit-eval.json``), which ``recipekit report`` and ``compare`` show. A failed
    evaluation is recorded with its reason and never fails the run: the model is saved by then.
    """

    enabled: bool = spec(False, description="Run the benchmark after training (the image installs the harness).")
    tasks: list[Annotated[str, TASK_NAME]] = spec(
        default_factory=lambda: ["arc_easy", "hellaswag"],
        description="lm-evaluation-harness tasks or groups. Its built-in tasks read their datasets from the "
        "Hugging Face Hub (or HF_DATASETS_CACHE); without the Hub, name tasks of eval.task_dir.",
    )
    task_dir: str | None = spec(
        None,
        domain=ABSOLUTE_PATH,
        description="A directory of task YAMLs (the harness's include_path), on the volume: local tasks with "
        "`dataset_path: json` and `data_files`, for clusters without the Hub.",
    )
    limit: int | None = spec(
        None, gt=0, le=1_000_000, description="At most this many items per task (default: every item)."
    )
    num_fewshot: int | None = spec(
        None, ge=0, le=64, description="Few-shot examples per item (default: each task's own)."
    )
    batch_size: int = spec(8, gt=0, le=4096, description="Items scored per forward pass.")

    def rules(self) -> list[str | tuple[str, str]]:
        if self.enabled and not self.tasks:
            return [("tasks", "empty while eval.enabled: name at least one task (e.g. [arc_easy])")]
        return []
