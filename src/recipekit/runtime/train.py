"""The bundle's training entrypoint: recipe.yaml in, a trained model (or LoRA adapter) and checkpoints out.

``recipekit build`` copies this file verbatim into every bundle; run.sh starts one process per device with
``torchrun ... train.py --recipe recipe.yaml --resume auto``. It imports only the standard library, yaml and the
training stack of the image (torch, transformers, datasets, tokenizers; peft, deepspeed, bitsandbytes and torch_npu
only when the recipe needs them), never recipekit: a bundle must run wherever its image runs.

The Hugging Face ``Trainer`` does the training. This file decides what the Trainer cannot know from the recipe:
the device actually present (a recipe's backend/optimizer/precision are adapted to it and each change is logged),
how the data is read, validated, tokenised, masked and packed, how the model is built (pretrained, or a random
twin with a tokenizer trained here), which checkpoint to resume from, and what to do on SIGTERM.

Outputs in ``training_arguments.output_dir``:
  checkpoint-N/     Trainer checkpoints (save_steps, save_total_limit); one more on SIGTERM
  metrics.jsonl     one JSON object per logging step (loss, learning_rate, tokens/s, TFLOPS, MFU, ...): the file
                    tests and dry runs read; trainer_state.json's log_history lacks the throughput figures
  random-init/      the random twin's initial weights and tokenizer (``model.init: random`` only), so that resume,
                    adapters and merges all refer to one base
  the final model   full weights, or the LoRA adapter (plus merged/ when ``lora.merge_on_save``)
  cache/datasets/   the Arrow cache of the loaded and tokenised data: the main process writes it, the others read it
  runs/             TensorBoard event files (when ``report_to`` has tensorboard)

Exit codes: 0 done; 2 a problem the user can fix (recipe, data, checkpoint), printed as one line; 143 stopped by
SIGTERM after saving a checkpoint (non-zero, so Volcano restarts the job rather than completing it); 1 a bug.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import datasets
import torch
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

LOG = logging.getLogger("train")
IGNORE_INDEX = -100  # label value the loss skips (torch.nn.CrossEntropyLoss ignore_index)
EXIT_USER_ERROR = 2
EXIT_PREEMPTED = 128 + signal.SIGTERM
RANDOM_INIT_DIR = "random-init"
METRICS_FILE = "metrics.jsonl"
TOKENIZER_SAMPLE_LIMIT = 50_000  # records the random twin's tokenizer is trained on: plenty for a dry-run vocabulary
MAP_BATCH = 1_000  # rows per datasets.map batch; also the window the packer fills its bins from
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_model.safetensors",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.bin",
)
ROLES = ("system", "user", "assistant")
SPECIAL_TOKENS = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
#: Used by the random twin, and by a pretrained tokenizer that has no template of its own. Role markers are
#: special tokens of the twin's tokenizer; each turn ends with eos, so a model learns to stop after its answer.
CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
#: The optimizer each device runs fastest; a recipe built for another device gets this one instead.
DEVICE_OPTIM = {"npu": "adamw_torch_npu_fused", "cuda": "adamw_torch_fused", "cpu": "adamw_torch"}


class RunError(Exception):
    """A problem the user can fix; main() prints it as one line and exits 2, without a traceback."""


class DataError(RunError):
    """Bad training data, located precisely enough to fix by hand: file, line and field."""

    def __init__(self, path: Path | str, message: str, line: int | None = None, field: str | None = None):
        where = f"{path}:{line}" if line else str(path)
        what = f"field {field!r}: {message}" if field else message
        super().__init__(f"data error: {where}: {what}")


# ------------------------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class RunConfig:
    """recipe.yaml, split into the parts this file uses. ``recipe`` and ``plan`` allow attribute access."""

    recipe: Any
    plan: Any
    training_arguments: dict[str, Any]
    bundle_dir: Path


def _namespace(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_namespace(v) for v in value]
    return value


def load_run_config(path: Path) -> RunConfig:
    """Read the bundle's recipe.yaml: the resolved recipe, the plan's numbers and the Trainer arguments."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RunError(f"cannot read recipe {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise RunError(f"{path} is not valid YAML: {exc}") from None
    missing = [key for key in ("recipe", "plan", "training_arguments") if not isinstance((raw or {}).get(key), dict)]
    if missing:
        raise RunError(f"{path} lacks section(s) {', '.join(missing)}: rebuild the bundle with `recipekit build`")
    return RunConfig(
        _namespace(raw["recipe"]), _namespace(raw["plan"]), dict(raw["training_arguments"]), path.resolve().parent
    )


# ------------------------------------------------------------------------------------------------------ device
@dataclass(frozen=True)
class Device:
    """The accelerator this process found, and what it supports."""

    kind: str  # npu | cuda | cpu
    backend: str  # hccl | nccl | gloo
    bf16: bool


def detect_device() -> Device:
    """NPU when torch_npu imports and sees a device, else CUDA, else CPU. Decided here, at run time, not at build."""
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except ImportError:
        pass  # not an Ascend image
    except Exception as exc:  # noqa: BLE001 - an Ascend image whose driver or CANN fails: say why, look further
        LOG.warning("torch_npu is installed but failed to load: %s", exc)
    else:
        if torch.npu.is_available():
            return Device("npu", "hccl", bool(getattr(torch.npu, "is_bf16_supported", lambda: True)()))
    if torch.cuda.is_available():
        return Device("cuda", "nccl", torch.cuda.is_bf16_supported())
    return Device("cpu", "gloo", True)


def adapt_training_arguments(
    kwargs: dict[str, Any], device: Device, bundle_dir: Path, world_size: int, planned_world_size: int
) -> tuple[dict[str, Any], list[str]]:
    """Fit the planned Trainer arguments to ``device``; return them and one human-readable note per change.

    A bundle built for Ascend must still dry-run on a laptop: backend, optimizer and precision follow the device
    found, the DeepSpeed config path (relative to recipe.yaml) is resolved and its precision and batch checks kept
    consistent with the Trainer's, so DeepSpeed and the Trainer cannot disagree.
    """
    args, notes = dict(kwargs), []
    if args.get("ddp_backend") not in (None, device.backend):
        notes.append(f"backend {args['ddp_backend']} is not available on {device.kind}: using {device.backend}")
        args["ddp_backend"] = device.backend
    if args.get("optim") in DEVICE_OPTIM.values() and args["optim"] != DEVICE_OPTIM[device.kind]:
        notes.append(f"optimizer {args['optim']} needs another device: using {DEVICE_OPTIM[device.kind]}")
        args["optim"] = DEVICE_OPTIM[device.kind]
    if args.get("fp16") and device.kind == "cpu":
        notes.append("fp16 is not supported on cpu: using bf16")
        args.update(fp16=False, bf16=True)
    elif args.get("bf16") and not device.bf16:
        notes.append(f"this {device.kind} has no bf16: using fp16")
        args.update(bf16=False, fp16=True)
    if device.kind == "cpu":
        args["use_cpu"] = True
    if args.get("deepspeed"):
        args["deepspeed"] = _deepspeed_config(args, bundle_dir, world_size, planned_world_size, notes)
    return args, notes


def _deepspeed_config(
    args: dict[str, Any], bundle_dir: Path, world_size: int, planned_world_size: int, notes: list[str]
) -> dict[str, Any]:
    path = Path(args["deepspeed"])
    path = path if path.is_absolute() else bundle_dir / path
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunError(f"cannot read the DeepSpeed config {path}: {exc}") from None
    for precision in ("bf16", "fp16"):
        if args.get(precision):
            config[precision] = {**config.get(precision, {}), "enabled": True}
        else:
            config.pop(precision, None)
    if world_size != planned_world_size and isinstance(config.get("train_batch_size"), int):
        notes.append(
            f"world size is {world_size}, the plan's is {planned_world_size}: the global batch follows the world size"
        )
        config["train_batch_size"] = "auto"
    return config


def prepare_launch_environment(args: dict[str, Any], device: Device, notes: list[str]) -> None:
    """Make a run started without torchrun (``python train.py``, a dry run) work as one process.

    Without a launcher a plain run needs no process group, so ``ddp_backend`` is dropped; DeepSpeed always needs
    one, so it gets a single-process rendezvous on a free local port, and the accelerator it should use.
    """
    launched = "LOCAL_RANK" in os.environ
    if not args.get("deepspeed"):
        if not launched:
            args.pop("ddp_backend", None)
        return
    if os.environ.get("DS_ACCELERATOR", device.kind) != device.kind:
        notes.append(f"DS_ACCELERATOR={os.environ['DS_ACCELERATOR']} but this is {device.kind}: using {device.kind}")
    os.environ["DS_ACCELERATOR"] = device.kind
    if not launched:
        notes.append("not started by torchrun: running DeepSpeed as a single process")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )


def join_deepspeed_group(device: Device) -> None:
    """Register the process group with DeepSpeed's comm layer before any model is built.

    On CPU, Accelerate starts torch.distributed itself, behind DeepSpeed's back; ZeRO-3 then partitions the model
    in ``from_pretrained`` (deepspeed.zero.Init) while DeepSpeed still believes it runs alone, and its batch check
    fails with "world_size 1". ``init_distributed`` adopts the existing group.
    """
    import deepspeed

    if not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=device.backend)


def make_training_arguments(kwargs: dict[str, Any]) -> TrainingArguments:
    try:
        return TrainingArguments(**kwargs)
    except TypeError as exc:  # an argument this transformers version does not know
        raise RunError(f"training_arguments: {exc} (the image has transformers {_version('transformers')})") from None


# -------------------------------------------------------------------------------------------------------- data
def data_files(path: Path, fmt: str) -> list[Path]:
    """The files a data path stands for: the file itself, or a directory's .jsonl (and, for text, .txt) files."""
    if not path.exists():
        raise DataError(path, "does not exist")
    if path.is_file():
        return [path]
    suffixes = (".jsonl", ".txt") if fmt == "text" else (".jsonl",)
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in suffixes)
    if not files:
        raise DataError(path, f"directory holds no {' or '.join(suffixes)} files")
    return files


def validate_data_file(path: Path, fmt: str) -> int:
    """Check every record of a JSONL file before any tokenisation; return the record count or raise DataError.

    A raw .txt file is only checked for content (it has no records; 0 is returned).
    """
    if path.stat().st_size == 0:
        raise DataError(path, "file is empty")
    if fmt == "text" and path.suffix == ".txt":
        return 0
    count = 0
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(path, f"not UTF-8 text (byte {exc.start + 1})", number) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(path, f"not valid JSON ({exc.msg} at column {exc.colno})", number) from None
            if not isinstance(record, dict):
                raise DataError(path, f"expected a JSON object, got {type(record).__name__}", number)
            _validate_record(record, fmt, path, number)
            count += 1
    if not count:
        raise DataError(path, "holds no records (only blank lines)")
    return count


def _validate_record(record: dict[str, Any], fmt: str, path: Path, line: int) -> None:
    required = {"alpaca": ("instruction", "output"), "text": ("text",), "messages": ("messages",)}[fmt]
    for field in required:
        if field not in record:
            raise DataError(path, "missing", line, field)
    for field in ("instruction", "input", "output", "text"):
        if field in record and record[field] is not None and not isinstance(record[field], str):
            raise DataError(path, f"must be a string, got {type(record[field]).__name__}", line, field)
    if fmt == "messages":
        _validate_messages(record["messages"], path, line)


def _validate_messages(messages: Any, path: Path, line: int) -> None:
    if not isinstance(messages, list) or not messages:
        raise DataError(path, "must be a non-empty list of {role, content} objects", line, "messages")
    for index, message in enumerate(messages):
        field = f"messages[{index}]"
        if not isinstance(message, dict):
            raise DataError(path, "must be an object with role and content", line, field)
        if message.get("role") not in ROLES:
            raise DataError(
                path, f"role must be one of {', '.join(ROLES)}, got {message.get('role')!r}", line, f"{field}.role"
            )
        if not isinstance(message.get("content"), str):
            raise DataError(path, "missing or not a string", line, f"{field}.content")
    roles = [m["role"] for m in messages if m["role"] != "system"]
    if not roles or roles[0] != "user":
        raise DataError(path, "the first non-system turn must be the user's", line, "messages")
    if "assistant" not in roles:
        raise DataError(path, "no assistant turn: nothing to learn from", line, "messages")


def load_raw_dataset(data: Any, cache_dir: Path) -> datasets.Dataset:
    """Validate the data files, then load them as one memory-mapped Arrow dataset cached under ``cache_dir``."""
    files = data_files(Path(data.path), data.format)
    for path in files:
        validate_data_file(path, data.format)
    parts = []
    jsonl = [str(p) for p in files if p.suffix != ".txt"]
    text = [str(p) for p in files if p.suffix == ".txt"]
    if jsonl:
        records = datasets.load_dataset("json", data_files=jsonl, split="train", cache_dir=str(cache_dir))
        parts.append(records.select_columns(["text"]) if text else records)
    if text:  # a paragraph (text between blank lines) is one document
        parts.append(
            datasets.load_dataset(
                "text", data_files=text, sample_by="paragraph", split="train", cache_dir=str(cache_dir)
            )
        )
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def conversations(batch: dict[str, list], fmt: str) -> Iterator[list[dict[str, str]]]:
    """The batch's records as chat turns; an alpaca record is one user turn and one assistant turn."""
    if fmt == "messages":
        for messages in batch["messages"]:
            yield [{"role": m["role"], "content": m["content"]} for m in messages]
        return
    inputs = batch.get("input") or [None] * len(batch["instruction"])
    for instruction, given, output in zip(batch["instruction"], inputs, batch["output"]):
        prompt = f"{instruction}\n\n{given}" if given else instruction
        yield [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]


def render_chat(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer: Any, messages: list[dict[str, str]], text: str) -> list[tuple[int, int]]:
    """Character spans of ``text`` that the model must learn: each assistant reply and its end-of-turn marker.

    A reply starts where the conversation up to it, rendered with the generation prompt, ends; it ends where the
    conversation including it ends. That holds for any template that renders a conversation as a prefix of its
    continuation, which is checked.
    """
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(render_chat(tokenizer, messages[:index], generation_prompt=True))
        upto = render_chat(tokenizer, messages[: index + 1])
        if not text.startswith(upto) or start > len(upto):
            raise RunError(
                "the tokenizer's chat template does not render a conversation as a prefix of its "
                "continuation, so prompt tokens cannot be masked"
            )
        spans.append((start, len(upto)))
    return spans


def encode_conversation(tokenizer: Any, messages: list[dict[str, str]], max_len: int) -> dict[str, list[int]]:
    """Token ids and labels of one conversation: labels are -100 on every prompt token; truncated to max_len."""
    text = render_chat(tokenizer, messages)
    spans = assistant_spans(tokenizer, messages, text)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"][:max_len]
    labels = [
        token if any(s <= start < e for s, e in spans) else IGNORE_INDEX
        for token, (start, _) in zip(ids, encoded["offset_mapping"])
    ]
    return {"input_ids": ids, "labels": labels}


def tokenize_conversations(batch: dict[str, list], tokenizer: Any, fmt: str, max_len: int) -> dict[str, list]:
    """datasets.map function: encode each record; drop those whose answer lies wholly beyond max_len."""
    out: dict[str, list] = {"input_ids": [], "labels": []}
    for messages in conversations(batch, fmt):
        sample = encode_conversation(tokenizer, messages, max_len)
        if any(label != IGNORE_INDEX for label in sample["labels"]):
            out["input_ids"].append(sample["input_ids"])
            out["labels"].append(sample["labels"])
    return out


def tokenize_into_blocks(batch: dict[str, list], tokenizer: Any, block_len: int) -> dict[str, list]:
    """datasets.map function for pretraining: documents joined with eos, cut into block_len token blocks.

    The tail shorter than a block at the end of each map batch is dropped (at most one block per batch).
    """
    stream: list[int] = []
    for ids in tokenizer([t for t in batch["text"] if t.strip()], add_special_tokens=False)["input_ids"]:
        stream += ids + [tokenizer.eos_token_id]
    usable = len(stream) // block_len * block_len
    return {"input_ids": [stream[i : i + block_len] for i in range(0, usable, block_len)]}


def pack_samples(batch: dict[str, list], max_len: int) -> dict[str, list]:
    """datasets.map function: pack samples into rows of at most max_len tokens, best-fit decreasing.

    Each row carries ``position_ids`` that restart at 0 for every sample. With no attention_mask, transformers
    derives a block-diagonal causal mask from them (sdpa, eager, flash), so no token attends to another sample and
    each sample sees the positions it would see alone. The first label of every sample is -100: it would otherwise
    be predicted from the previous sample's last token.
    """
    lengths = [len(ids) for ids in batch["input_ids"]]
    rooms: list[tuple[int, int]] = []  # (free tokens, bin index), sorted: bisect finds the tightest bin that fits
    bins: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        slot = bisect.bisect_left(rooms, (lengths[index], -1))
        if slot == len(rooms):
            bins.append([])
            room, target = max_len, len(bins) - 1
        else:
            room, target = rooms.pop(slot)
        bins[target].append(index)
        bisect.insort(rooms, (room - lengths[index], target))
    out: dict[str, list] = {"input_ids": [], "labels": [], "position_ids": []}
    for members in bins:
        out["input_ids"].append([t for i in members for t in batch["input_ids"][i]])
        out["labels"].append([IGNORE_INDEX if k == 0 else t for i in members for k, t in enumerate(batch["labels"][i])])
        out["position_ids"].append([k for i in members for k in range(lengths[i])])
    return out


@dataclass
class SequenceCollator:
    """Right-pads a batch to its longest row. Labels are -100 on padding.

    Plain rows get an attention_mask (only when padding was added, so unpadded batches keep the fast causal path).
    Packed rows get none, since their mask comes from position_ids; their padding is a separate pseudo-sample.
    """

    pad_token_id: int

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        longest = max(len(row["input_ids"]) for row in rows)
        packed = "position_ids" in rows[0]
        batch: dict[str, list] = {"input_ids": [], "labels": [], "attention_mask": [], "position_ids": []}
        padded = False
        for row in rows:
            ids, pad = row["input_ids"], longest - len(row["input_ids"])
            padded = padded or pad > 0
            batch["input_ids"].append(ids + [self.pad_token_id] * pad)
            batch["labels"].append(list(row.get("labels", ids)) + [IGNORE_INDEX] * pad)
            if packed:
                batch["position_ids"].append(row["position_ids"] + list(range(pad)))
            else:
                batch["attention_mask"].append([1] * len(ids) + [0] * pad)
        keep = ["input_ids", "labels"] + (["position_ids"] if packed else ["attention_mask"] if padded else [])
        return {key: torch.tensor(batch[key], dtype=torch.long) for key in keep}


def build_datasets(
    raw: datasets.Dataset,
    tokenizer: Any,
    data: Any,
    seed: int,
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """Tokenised (and for pretraining blocked, for SFT optionally packed) train and eval sets, cached by content."""
    workers = _map_workers(len(raw))
    if data.format == "text":
        tokenized = _map(raw, tokenize_into_blocks, tokenizer, workers, block_len=data.max_len)
        if not len(tokenized):
            raise RunError(f"data {data.path} yields no full block of max_len={data.max_len} tokens")
    else:
        tokenized = _map(raw, tokenize_conversations, tokenizer, workers, fmt=data.format, max_len=data.max_len)
        if len(tokenized) < len(raw):
            _log0(
                "%d of %d samples dropped: their answer starts beyond max_len=%d",
                len(raw) - len(tokenized),
                len(raw),
                data.max_len,
                level=logging.WARNING,
            )
        if not len(tokenized):
            raise RunError(f"no sample of {data.path} has an answer within max_len={data.max_len}")
    train, evaluation = tokenized, None
    if data.eval_fraction > 0:
        split = tokenized.train_test_split(test_size=data.eval_fraction, seed=seed)
        train, evaluation = split["train"], split["test"]
    if data.format != "text" and data.packing:
        train = _map(train, pack_samples, None, workers, max_len=data.max_len)
        if evaluation is not None:
            evaluation = _map(evaluation, pack_samples, None, workers, max_len=data.max_len)
    return train, evaluation


def _map(
    dataset: datasets.Dataset, function: Any, tokenizer: Any, workers: int | None, **kwargs: Any
) -> datasets.Dataset:
    """``dataset.map(function)``, whose output columns replace the input's, with a fingerprint made of the input's,
    the tokenizer's content and the arguments.

    An explicit fingerprint makes every rank, and every restart, find the main process's cache files, whatever
    the pickling of a tokenizer object happens to produce. ``tokenizer`` (None for token-level steps) is passed on.
    """
    parts = [dataset._fingerprint, function.__name__, json.dumps(kwargs, sort_keys=True)]
    if tokenizer is not None:
        parts.append(_tokenizer_digest(tokenizer))
        kwargs["tokenizer"] = tokenizer
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    return dataset.map(
        function,
        batched=True,
        batch_size=MAP_BATCH,
        remove_columns=dataset.column_names,
        fn_kwargs=kwargs,
        num_proc=workers,
        new_fingerprint=digest,
        desc=function.__name__.replace("_", " "),
    )


def _tokenizer_digest(tokenizer: Any) -> str:
    content = tokenizer.backend_tokenizer.to_str() + str(tokenizer.chat_template)
    return hashlib.sha256(content.encode()).hexdigest()


def _map_workers(rows: int) -> int | None:
    """Worker processes for tokenisation: worth their start-up cost only on large data."""
    return min(8, os.cpu_count() or 1) if rows >= 50_000 else None


# --------------------------------------------------------------------------------------------------- tokenizer
def corpus_texts(raw: datasets.Dataset, fmt: str, limit: int = TOKENIZER_SAMPLE_LIMIT) -> Iterator[str]:
    """The text of up to ``limit`` records, for training the random twin's tokenizer on the run's own data."""
    sample = raw.select(range(min(limit, len(raw))))
    for batch in sample.iter(batch_size=MAP_BATCH):
        if fmt == "text":
            yield from batch["text"]
        else:
            for messages in conversations(batch, fmt):
                yield from (m["content"] for m in messages)


def train_tokenizer(texts: Iterable[str], vocab_size: int, max_length: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of at most ``vocab_size`` tokens, with bos/eos/pad, role markers and a chat template.

    Byte-level means any text encodes (no unknown token); the BPE trainer is deterministic, so every process
    trained on the same data would build the same tokenizer (the main process trains it once anyway).
    """
    roles = [f"<|{role}|>" for role in ROLES]
    specials = [*SPECIAL_TOKENS.values(), *roles]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=max_length, extra_special_tokens=roles, **SPECIAL_TOKENS
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def load_tokenizer(path: str, trust_remote_code: bool) -> Any:
    """The model's tokenizer, given a pad token and a chat template if it lacks them (both logged)."""
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if not getattr(tokenizer, "is_fast", False):
        raise RunError(f"the tokenizer of {path} is not a fast tokenizer: prompt masking needs offset mappings")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        _log0("tokenizer has no pad token: padding with eos (%s); padding is never in the loss", tokenizer.eos_token)
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
        _log0("tokenizer has no chat template: using recipekit's plain <|role|> template")
    return tokenizer


# ------------------------------------------------------------------------------------------------------- model
def architecture_config(spec: Any, tokenizer: Any) -> LlamaConfig | Qwen2Config:
    """A transformers config from the recipe's architecture numbers (the random twin has no config.json)."""
    common = {
        "vocab_size": max(spec.vocab_size, len(tokenizer)),
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": spec.rms_norm_eps,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "use_cache": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if spec.family == "llama":
        return LlamaConfig(**common, attention_bias=spec.attention_bias)
    return Qwen2Config(**common)  # Qwen2 always has q/k/v biases


def create_random_init(spec: Any, raw: datasets.Dataset, fmt: str, seed: int, destination: Path) -> None:
    """Write the random twin (seeded weights and a tokenizer trained on the data) to ``destination``, atomically.

    Written once, then loaded like any pretrained checkpoint, so a resumed run, a LoRA adapter and a merge all use
    the very same base weights and tokenizer.
    """
    if (destination / "config.json").exists():
        return
    tokenizer = train_tokenizer(corpus_texts(raw, fmt), spec.vocab_size, spec.max_position_embeddings)
    torch.manual_seed(seed)
    # The class itself, not AutoModelForCausalLM.from_config: under ZeRO-3 from_config partitions the new model with
    # deepspeed.zero.Init, a collective this one process would run alone. The weights are written whole here and
    # partitioned when every rank loads them.
    config = architecture_config(spec, tokenizer)
    model = (LlamaForCausalLM if spec.family == "llama" else Qwen2ForCausalLM)(config)
    staging = destination.with_name(f"{destination.name}.tmp-{os.getpid()}")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    os.replace(staging, destination)
    _log0("random twin: %d-token tokenizer and seeded weights written to %s", len(tokenizer), destination)


#: The recipe's 16-bit precisions as torch dtypes (fp32 is everything else).
HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def weight_dtype(precision: str, mode: str, deepspeed: bool) -> torch.dtype:
    """The dtype weights are loaded in.

    Half precision when the loaded weights are never updated in place by a plain optimizer: a frozen LoRA base
    (adapters stay fp32), or DeepSpeed, which keeps its own fp32 master copy. Full training under the Trainer's AMP
    needs fp32 weights: AMP computes in half precision but has no master copy.
    """
    half = HALF_DTYPES.get(precision)
    if half is not None and (mode in ("lora", "qlora") or deepspeed):
        return half
    return torch.float32


def quantization_config(mode: Any, device: Device, compute_dtype: torch.dtype) -> Any:
    """bitsandbytes 4-bit loading for QLoRA, or None (logged) where it cannot run: then the run is plain LoRA."""
    if mode.kind != "qlora":
        return None
    if device.kind == "cpu":
        _log0("qlora: 4-bit loading needs an accelerator; training plain LoRA on the unquantised model")
        return None
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except ImportError as exc:
        _log0("qlora: bitsandbytes unavailable (%s); training plain LoRA on the unquantised model", exc)
        return None
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=mode.quant.quant_type,
        bnb_4bit_use_double_quant=mode.quant.double_quant,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def load_model(path: str, recipe: Any, args: TrainingArguments, device: Device) -> Any:
    """The model to train: loaded, optionally quantised, and wrapped in a LoRA adapter for lora/qlora."""
    mode = recipe.mode
    dtype = weight_dtype(_precision(args), mode.kind, bool(args.deepspeed))
    quant = quantization_config(mode, device, dtype)
    extra = {"quantization_config": quant, "device_map": {"": args.device}} if quant else {}
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, trust_remote_code=recipe.model.trust_remote_code, **extra
    )
    model.config.use_cache = False  # a KV cache in training would also disable the packed-sequence mask
    if mode.kind not in ("lora", "qlora"):
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if quant:
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=bool(args.activation_checkpointing),
            gradient_checkpointing_kwargs=args.activation_checkpointing_kwargs,
        )
    elif args.activation_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks need an input that requires grad
    lora = mode.lora
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        task_type="CAUSAL_LM",
        target_modules=lora.target_modules,
    )
    return get_peft_model(model, config)


def parameter_counts(model: Any) -> tuple[int, int]:
    """(trainable, total) parameters; ZeRO-3 partitions report their full size in ``ds_numel``."""
    trainable = total = 0
    for parameter in model.parameters():
        count = getattr(parameter, "ds_numel", parameter.numel())
        total += count
        trainable += count if parameter.requires_grad else 0
    return trainable, total


def save_merged(path: str, output_dir: Path, recipe: Any, precision: str, tokenizer: Any) -> Path:
    """Merge the saved adapter into a fresh, unquantised copy of the base and write it to output_dir/merged."""
    from peft import PeftModel

    dtype = HALF_DTYPES.get(precision, torch.float32)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=recipe.model.trust_remote_code)
    merged = PeftModel.from_pretrained(base, str(output_dir)).merge_and_unload()
    target = output_dir / "merged"
    merged.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


# ------------------------------------------------------------------------------------------------- checkpoints
def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` cannot be resumed from (None when complete): unparsable state, missing or truncated weights.

    The Trainer writes trainer_state.json last, so a checkpoint interrupted while saving lacks it or has it cut.
    """
    try:
        json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "trainer_state.json missing or unreadable"
    if (path / "checkpoint-is-incomplete.txt").exists():
        return "marked incomplete"
    weights = [path / name for name in WEIGHT_FILES if (path / name).exists()]
    if not weights:
        return "no model weights"
    for file in weights:
        problem = _weights_file_problem(file)
        if problem:
            return problem
    return None


def _weights_file_problem(file: Path) -> str | None:
    if file.name.endswith(".index.json"):
        try:
            shards = set(json.loads(file.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError):
            return f"{file.name} unreadable"
        for shard in sorted(shards):
            if not (file.parent / shard).exists():
                return f"shard {shard} missing"
            problem = _weights_file_problem(file.parent / shard)
            if problem:
                return problem
        return None
    if file.suffix == ".safetensors":
        return _safetensors_problem(file)
    return None if file.stat().st_size else f"{file.name} is empty"


def _safetensors_problem(file: Path) -> str | None:
    """A safetensors file is complete when it holds its header and every byte the header points to."""
    size = file.stat().st_size
    try:
        with file.open("rb") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(header_len)) if 8 + header_len <= size else None
    except (OSError, ValueError):
        header = None
    if header is None:
        return f"{file.name} has a truncated header"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        return f"{file.name} truncated ({size} of {8 + header_len + end} bytes)"
    return None


def resume_checkpoint(output_dir: Path, resume: str) -> str | None:
    """The checkpoint to resume from: ``none``; ``auto``, the newest complete checkpoint-N; or an explicit path."""
    if resume == "none":
        return None
    if resume != "auto":
        path = Path(resume)
        problem = checkpoint_problem(path) if path.is_dir() else "not a directory"
        if problem:
            raise RunError(f"--resume {resume}: {problem}")
        return str(path)
    candidates = [p for p in output_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    for path in sorted(candidates, key=lambda p: int(p.name.split("-")[-1]), reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return str(path)
        _log0("skipping %s: %s", path.name, problem)
    return None


# --------------------------------------------------------------------------------------------------- callbacks
def flops_per_token(parameters: int, layers: int, hidden: int, seq_len: int) -> int:
    """Training FLOPs per token: 6·N + 12·L·h·s (Chinchilla; PaLM, appendix B).

    6·N: forward (2·N) and backward (4·N) matmuls over N parameters. 12·L·h·s: attention scores and their
    weighted sum, forward and backward, in L layers of width h over a sequence of s tokens. Activation recomputation
    is not counted (this is model FLOPs, as in MFU), and for LoRA the frozen weights' gradient (2·N) is counted too,
    so LoRA's MFU is optimistic by up to a third.
    """
    return 6 * parameters + 12 * layers * hidden * seq_len


class ThroughputCallback(TrainerCallback):
    """Adds tokens/s, achieved TFLOP/s and MFU per device to every training log, over the interval since the last.

    Tokens are the Trainer's ``num_input_tokens_seen`` (all tokens, padding included: the device computed them),
    summed over processes; the figures are per device. It must run before the reporting callbacks, see main().
    """

    def __init__(self, flops_per_token: int, peak_tflops: float, world_size: int):
        self.flops_per_token, self.peak_tflops, self.world_size = flops_per_token, peak_tflops, world_size
        self._time, self._tokens = time.perf_counter(), 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._time, self._tokens = time.perf_counter(), state.num_input_tokens_seen

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs is None or "loss" not in logs:
            return
        now, tokens = time.perf_counter(), state.num_input_tokens_seen
        elapsed, seen = now - self._time, tokens - self._tokens
        self._time, self._tokens = now, tokens
        if elapsed <= 0 or seen <= 0:
            return
        per_device = seen / elapsed / self.world_size
        tflops = per_device * self.flops_per_token / 1e12
        logs.update(
            tokens_per_second_per_device=round(per_device, 1),
            tflops_per_device=round(tflops, 4),
            mfu=round(tflops / self.peak_tflops, 5),
        )


class MetricsFileCallback(TrainerCallback):
    """Appends every log (training, evaluation, final summary) as one JSON line to output_dir/metrics.jsonl."""

    def __init__(self, path: Path):
        self.path = path

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs and state.is_world_process_zero:
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps({"step": state.global_step, **logs}) + "\n")


class PreemptionCallback(TrainerCallback):
    """SIGTERM (Volcano eviction or preemption) → save a checkpoint at the end of this step, then stop training.

    Every rank receives the signal (torchrun forwards it) but maybe during different steps, so the ranks agree by
    an all-reduce at each step end: all of them save the same step, and no collective is left waiting.
    """

    def __init__(self) -> None:
        self.requested = False
        self.stopped_at: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.requested = True

    def _agreed(self, args: Any) -> bool:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return self.requested
        flag = torch.tensor([int(self.requested)], device=args.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stopped_at is None and self._agreed(args):
            control.should_save = control.should_training_stop = True
            self.stopped_at = state.global_step


# -------------------------------------------------------------------------------------------------------- main
def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _log0(message: str, *args: Any, level: int = logging.INFO) -> None:
    """Log on global rank 0 only: every rank makes the same decisions, one report of them is enough."""
    if _rank() == 0:
        LOG.log(level, message, *args)


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    with contextlib.suppress(PackageNotFoundError):
        return version(package)
    return "?"


def _precision(args: TrainingArguments) -> str:
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def _peak_tflops(hw: Any, precision: str) -> float:
    """The MFU denominator: the recipe's fp16 peak for fp16, else its bf16 peak (fp32 has no peak in the recipe)."""
    return hw.peak_tflops_fp16 if precision == "fp16" else hw.peak_tflops_bf16


def summary_lines(
    run: RunConfig,
    args: TrainingArguments,
    device: Device,
    model_path: str,
    counts: tuple[int, int],
    train: datasets.Dataset,
    evaluation: datasets.Dataset | None,
    resume_from: str | None,
) -> list[str]:
    """The startup block rank 0 logs: what runs where, and how big it is."""
    recipe, trainable, total = run.recipe, *counts
    data = recipe.data
    zero = run.plan.zero_stage if args.deepspeed else 0
    batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    if data.format == "text":
        rows, packing = "blocks", "documents concatenated into blocks"
    else:
        rows = "packed rows" if data.packing else "samples"
        packing = "on, no attention across samples" if data.packing else "off"
    return [
        f"recipe {recipe.name}: {recipe.mode.kind} of {recipe.model.name} ({recipe.model.init} init) from {model_path}",
        (
            f"world size {args.world_size} | device {device.kind} | backend {args.ddp_backend or device.backend} | "
            f"precision {_precision(args)} | ZeRO {zero} | optimizer {getattr(args.optim, 'value', args.optim)}"
        ),
        (
            f"global batch {batch} = micro {args.per_device_train_batch_size} × accumulation "
            f"{args.gradient_accumulation_steps} × data-parallel {args.world_size}"
        ),
        f"parameters: {trainable:,} trainable of {total:,} ({100 * trainable / max(total, 1):.2f}%)",
        (
            f"data: {len(train):,} train {rows}, {len(evaluation) if evaluation is not None else 0:,} eval "
            f"({data.format}, max_len {data.max_len}, packing {packing})"
        ),
        f"output {args.output_dir} | resume from {resume_from or 'scratch'}",
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train from a recipekit bundle's recipe.yaml with the HF Trainer.")
    parser.add_argument("--recipe", type=Path, default=Path("recipe.yaml"), help="the bundle's recipe.yaml")
    parser.add_argument(
        "--resume",
        default="auto",
        help="auto: newest complete checkpoint in output_dir; none: start over; or a checkpoint path",
    )
    return parser.parse_args(argv)


def setup_logging() -> None:
    logging.basicConfig(
        level=logging.INFO if _rank() == 0 else logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s [rank {_rank()}] %(name)s: %(message)s",
    )
    if _rank() != 0:
        datasets.disable_progress_bars()


def training_arguments(run: RunConfig, device: Device) -> TrainingArguments:
    """The plan's Trainer arguments, fitted to the device and launcher found; creating them joins the process group."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    kwargs, notes = adapt_training_arguments(
        run.training_arguments, device, run.bundle_dir, world_size, run.plan.world_size
    )
    prepare_launch_environment(kwargs, device, notes)
    args = make_training_arguments(kwargs)
    if kwargs.get("deepspeed") and args.world_size > 1:
        join_deepspeed_group(device)
    for note in notes:
        _log0("adapted: %s", note)
    return args


def prepare_inputs(
    recipe: Any, args: TrainingArguments, output_dir: Path
) -> tuple[str, Any, datasets.Dataset, datasets.Dataset | None]:
    """Model path, tokenizer and the train/eval sets; each step on the main process first, then cached for the rest."""
    with args.main_process_first(local=False, desc="load and validate data"):
        raw = load_raw_dataset(recipe.data, output_dir / "cache" / "datasets")
    model_path = recipe.model.name_or_path
    if recipe.model.init == "random":
        model_path = str(output_dir / RANDOM_INIT_DIR)
        with args.main_process_first(local=False, desc="create the random twin"):
            if args.process_index == 0:
                create_random_init(recipe.model, raw, recipe.data.format, args.seed, Path(model_path))
    tokenizer = load_tokenizer(model_path, recipe.model.trust_remote_code)
    with args.main_process_first(local=False, desc="tokenize"):
        train_set, eval_set = build_datasets(raw, tokenizer, recipe.data, args.seed)
    return model_path, tokenizer, train_set, eval_set


def make_trainer(
    recipe: Any,
    args: TrainingArguments,
    model: Any,
    tokenizer: Any,
    train_set: datasets.Dataset,
    eval_set: datasets.Dataset | None,
    parameters: int,
) -> tuple[Trainer, PreemptionCallback]:
    """The Trainer with recipekit's callbacks: throughput first (reporters run in list order and must see its
    figures), then metrics.jsonl and SIGTERM handling."""
    output_dir = Path(args.output_dir)
    per_token = flops_per_token(parameters, recipe.model.num_layers, recipe.model.hidden_size, recipe.data.max_len)
    preemption = PreemptionCallback()
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        data_collator=SequenceCollator(tokenizer.pad_token_id),
        processing_class=tokenizer,
        callbacks=[MetricsFileCallback(output_dir / METRICS_FILE), preemption],
    )
    throughput = ThroughputCallback(per_token, _peak_tflops(recipe.hw, _precision(args)), args.world_size)
    trainer.callback_handler.callbacks.insert(0, throughput)
    return trainer, preemption


def save_results(trainer: Trainer, recipe: Any, args: TrainingArguments, model_path: str, tokenizer: Any) -> None:
    """The final model (full weights, gathered under ZeRO-3, or the LoRA adapter) with its tokenizer and state;
    for ``lora.merge_on_save`` also the merged model, written by rank 0 alone once the others have left."""
    output_dir = Path(args.output_dir)
    trainer.save_model(str(output_dir))
    trainer.save_state()
    lora = getattr(recipe.mode, "lora", None)
    merge_here = lora is not None and lora.merge_on_save and args.process_index == 0
    leave_process_group()
    if merge_here:
        merged = save_merged(model_path, output_dir, recipe, _precision(args), tokenizer)
        _log0("merged model written to %s", merged)


def leave_process_group() -> None:
    """Every rank waits for the others, then all tear the process group down together (after the final save, or
    after the checkpoint a SIGTERM asked for: paths every rank takes at the same step).

    Rank 0 saves last and the others finish first, or the reverse; a rank that destroys its gloo/HCCL/NCCL group and
    exits while another still has a collective or its teardown in flight makes that rank's transport lose its peer
    mid-operation, and the process aborts ("terminate called without an active exception", SIGABRT): a finished run
    reported as a failed pod, which Volcano restarts. Nothing after this point talks to other ranks (the LoRA merge
    is local to rank 0), so no barrier can time out on it.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def train(options: argparse.Namespace) -> int:
    run = load_run_config(options.recipe)
    recipe, device = run.recipe, detect_device()
    args = training_arguments(run, device)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model_path, tokenizer, train_set, eval_set = prepare_inputs(recipe, args, output_dir)
    model = load_model(model_path, recipe, args, device)
    if recipe.data.packing and recipe.model.trust_remote_code:
        _log0(
            "packing with remote model code: samples stay apart only if that code masks by position_ids as "
            "transformers' own models do",
            level=logging.WARNING,
        )
    counts = parameter_counts(model)
    trainer, preemption = make_trainer(recipe, args, model, tokenizer, train_set, eval_set, counts[1])
    resume_from = resume_checkpoint(output_dir, options.resume)
    for line in summary_lines(run, args, device, model_path, counts, train_set, eval_set, resume_from):
        _log0(line)

    preemption.install()
    trainer.train(resume_from_checkpoint=resume_from)
    if preemption.stopped_at is not None:  # every rank stopped at this step (the flag is all-reduced)
        _log0(
            "SIGTERM: saved checkpoint-%d; exiting %d so the job restarts and resumes from it",
            preemption.stopped_at,
            EXIT_PREEMPTED,
        )
        leave_process_group()
        return EXIT_PREEMPTED
    save_results(trainer, recipe, args, model_path, tokenizer)
    _log0("done: %d steps; model in %s", trainer.state.global_step, output_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    setup_logging()
    try:
        return train(options)
    except RunError as exc:
        print("train.py: " + " ".join(str(exc).split()), file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:  # a bug or an environment failure: keep the traceback, end with one line
        LOG.exception("training failed")
        print(f"train.py: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    # A rank that failed on its own does not destroy the process group: that is collective, and with its peers
    # blocked in a collective it would hang (NCCL/HCCL) instead of exiting. Exiting non-zero lets torchrun stop
    # the pod's other workers and Volcano restart the job.


if __name__ == "__main__":
    sys.exit(main())
