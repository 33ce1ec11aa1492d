"""Which tiny twin a dry run trains in place of the recipe's model.

In this order: the recipe's model itself when it already is a tiny random one; the hand-made twin of its family
(``recipes/model/tiny_<family>.yaml``, what every preset's dry run has trained all along); else the **generic twin**,
shrunk from the architecture's own transformers config that `recipekit model import` stored in the option
(``model.config``), so that any architecture transformers ships dry-runs (DeepSeek-V3's MLA and dense first layers,
Gemma 3's sliding-window layers, ...). Where none exists or none trains on this CPU, the dry run stops with the reason
in one line (``plan`` and ``build`` never need a twin).

Why the shrinking happens here, on recipekit's side, and not in the bundle's runtime: the work copy is planned and
rendered from the dry recipe, so its plan (memory, FLOPs per token, which the runtime's MFU divides by, ZeRO-3
buckets), its substitutions list and its recipe.yaml must describe the model that actually trains. Shrunk at run
time, the dry recipe would still describe the full model (a 671 B plan on a CPU) and the runtime would build something
no file shows. Here the twin becomes an ordinary model option — numbers, exact counts and FLOPs measured like an
import, and its own small ``config`` mapping — and the runtime builds it as it builds any random-weight model
(:func:`recipekit.runtime.model.twin.architecture_config`). The shrinking needs torch and transformers, which
recipekit's process never imports, so it runs in children (``python -m recipekit.runtime.model.shrink``, which also
trains the twin one step on this CPU, then :mod:`~recipekit.validate.dryrun.workdir.twinmeasure`; seconds).
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import RecipeError
from recipekit.recipe.compose import group_options
from recipekit.recipe.schema import printable, to_data, validate
from recipekit.recipe.sections import ModelSpec
from recipekit.validate.dryrun.options import DryRunUsageError
from recipekit.validate.shared.childpython import python_argv, safe_env

#: A random-weight option with at most this many parameters is already a twin: the dry run trains it as it is.
TWIN_MAX_PARAMS = 10_000_000
#: The children that make a generic twin: the runtime's shrinking (it trains the twin a step on this CPU), then the
#: import's measurement; each imports torch and transformers and builds a tiny model: seconds.
SHRINK_MODULE = "recipekit.runtime.model.shrink"
MEASURE_MODULE = "recipekit.validate.dryrun.workdir.twinmeasure"
CHILD_TIMEOUT_S = 600
#: The twin's vocabulary: what the tokenizer the runtime trains on the dry run's data may have (as the hand-made
#: twins'); the runtime fits the embedding to the tokenizer it trained (at least this many rows).
TWIN_VOCAB = 512


def find_twin(family: str) -> ModelSpec | None:
    """The tiny twin of ``family`` among the model options (random init, same family), tiny_<family> preferred."""
    found = []
    for name, path in group_options("model").items():
        try:
            data = yamlfile.read(path) or {}
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and data.get("family") == family and data.get("init") == "random":
            found.append((name != f"tiny_{family}", name, data))
    if not found:
        return None
    return validate(ModelSpec, sorted(found, key=lambda item: item[:2])[0][2], root="model")


def is_twin(model: ModelSpec) -> bool:
    """Whether ``model`` is itself a tiny random model (a dry run trains it unchanged)."""
    total = model.params.total if model.params else 0
    return model.init == "random" and 0 < total <= TWIN_MAX_PARAMS


def choose_twin(model: ModelSpec, tp: int, workdir: Path) -> tuple[ModelSpec, str]:
    """The twin a dry run trains for ``model`` under TP ``tp`` (a generic one made in ``workdir``), and what it is
    (for the substitutions list)."""
    if is_twin(model):
        return model, "the recipe's own tiny random model"
    twin = find_twin(model.family)
    if twin is not None:
        return twin, f"the tiny {model.family} twin: random weights, tokenizer trained on the data"
    if model.config is None:
        raise DryRunUsageError(
            f"cannot dry-run model {model.name}: recipes/model has no tiny twin of family {model.family!r} and the "
            "option carries no architecture config to shrink one from (`recipekit model import CONFIG` stores it)"
        )
    return generic_twin(model, tp, workdir), (
        f"a generic tiny {model.family} twin shrunk from the option's config, every layer kind kept: random weights, "
        "tokenizer trained on the data"
    )


def generic_twin(model: ModelSpec, tp: int, workdir: Path) -> ModelSpec:
    """The generic twin of ``model``: shrunk and trained a step on this CPU by the runtime (:data:`SHRINK_MODULE`),
    then measured like an import (:data:`MEASURE_MODULE`)."""
    why = f"cannot dry-run model {model.name}"
    workdir.mkdir(parents=True, exist_ok=True)
    full = workdir / "full-config.json"
    full.write_text(json.dumps({"model_type": model.family, **to_data(model.config)}), encoding="utf-8")
    shrunk = _child(why, SHRINK_MODULE, str(full), str(workdir / "twin"), str(TWIN_VOCAB), str(tp))
    if shrunk.returncode or not (workdir / "twin" / "config.json").is_file():
        raise DryRunUsageError(f"{why}: {_last_line(shrunk).removeprefix('no twin: ')}")
    measured = _child(why, MEASURE_MODULE, str(workdir / "twin" / "config.json"))
    answer = _answer(measured.stdout)
    if "problem" in answer or "option" not in answer:
        raise DryRunUsageError(f"{why}: {answer.get('problem') or _last_line(measured)}")
    option = {
        **answer["option"],
        "name": f"twin_{model.name}"[:63],
        "description": f"generic tiny twin of {model.name}",
        "name_or_path": f"tiny-random-{model.family}",
        "init": "random",
        "router_aux_loss": model.router_aux_loss,
    }
    try:
        return validate(ModelSpec, option, root="model")
    except RecipeError as exc:
        raise DryRunUsageError(f"{why}: its tiny twin is no valid model option ({exc.problems[0]})") from None


def _child(why: str, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            python_argv("-m", module, *args), capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=safe_env()
        )
    except subprocess.TimeoutExpired:
        raise DryRunUsageError(f"{why}: making its tiny twin took over {CHILD_TIMEOUT_S} s") from None


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The child's reason: stdout's last line where it said one, else stderr's (a crash's exception)."""
    lines = proc.stdout.strip().splitlines() or proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"]
    return printable(lines[-1][:300])


def _answer(stdout: str) -> dict[str, Any]:
    """The child's JSON answer: its last line (libraries may print before it)."""
    lines = stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def twin_heads(twin: ModelSpec, tp: int) -> tuple[int, int, int] | None:
    """(attention heads, key/value heads, hidden size) for the twin under TP ``tp``, or None when its own divide:
    the fewest heads that TP divides (and the key/value heads divide), at least 8 dimensions per head."""
    if twin.num_attention_heads % tp == 0 and twin.num_kv_heads % tp == 0:
        return None
    kv = math.lcm(twin.num_kv_heads, tp)
    attention = math.lcm(twin.num_attention_heads, kv)
    hidden = max(twin.hidden_size, 8 * attention)
    return attention, kv, hidden + (-hidden % attention)


def config_with_heads(config: dict[str, Any] | None, heads: tuple[int, int, int]) -> dict[str, Any] | None:
    """A hand-made twin's ``config`` mapping with the heads and width of :func:`twin_heads` (what the runtime builds
    from), the head's width following the new ones where the mapping names it."""
    if config is None:
        return None
    attention, kv, hidden = heads
    changed = {**to_data(config), "num_attention_heads": attention, "num_key_value_heads": kv, "hidden_size": hidden}
    if "head_dim" in changed:
        changed["head_dim"] = hidden // attention
    return changed


def twin_depth(twin: ModelSpec, stages: int) -> int | None:
    """The twin's depth when ``stages`` model chunks (pipeline stages × virtual stages) must each hold whole layers
    and its own do not divide: the next multiple of ``stages``; None where its depth already serves."""
    if twin.num_layers % stages == 0:
        return None
    return twin.num_layers + (-twin.num_layers % stages)


def config_with_depth(config: dict[str, Any] | None, layers: int) -> dict[str, Any] | None:
    """A twin's ``config`` mapping ``layers`` deep: ``num_hidden_layers``, and each list of layer kinds (one name a
    layer, as ``layer_types``) continued by repeating its pattern; lists of numbers (layer indices, say) stay."""
    if config is None:
        return None
    changed = to_data(config)
    depth = changed.get("num_hidden_layers")
    for key, value in list(changed.items()):
        if isinstance(value, list) and len(value) == depth and all(isinstance(kind, str) for kind in value):
            changed[key] = [value[i % len(value)] for i in range(layers)]
    changed["num_hidden_layers"] = layers
    return changed
