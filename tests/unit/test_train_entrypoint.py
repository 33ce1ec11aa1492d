"""The bundle's train.py, piece by piece, without running the Trainer (the real runs are tests/integration).

train.py is a standalone file copied into bundles, so it is imported here by path, as the bundle's python would.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipekit.paths import RUNTIME_DIR
from recipekit.tinydata import write_tiny_dataset

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TRAIN_PY = RUNTIME_DIR / "train.py"
#: What a bundle's image provides; anything else (recipekit above all) would break the bundle.
IMAGE_PACKAGES = {
    "yaml",
    "torch",
    "transformers",
    "datasets",
    "tokenizers",
    "peft",
    "deepspeed",
    "bitsandbytes",
    "torch_npu",
}


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("bundle_train", TRAIN_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tokenizer(train, tmp_path_factory):
    """The random twin's tokenizer, trained on the tiny chat data as a run would."""
    path = write_tiny_dataset("messages", tmp_path_factory.mktemp("tok") / "chat.jsonl")
    texts = [m["content"] for line in path.read_text().splitlines() for m in json.loads(line)["messages"]]
    return train.train_tokenizer(texts, vocab_size=512, max_length=512)


def _data(**fields):
    base = {"format": "alpaca", "path": "", "max_len": 128, "packing": False, "eval_fraction": 0.0}
    return SimpleNamespace(**{**base, **fields})


# ------------------------------------------------------------------------------------------------- packaging
def test_train_py_imports_only_what_the_image_has():
    imported = set()
    for node in ast.walk(ast.parse(TRAIN_PY.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    foreign = imported - IMAGE_PACKAGES - set(sys.stdlib_module_names) - {"__future__"}
    assert not foreign, f"train.py imports {foreign}; a bundle's image has only {sorted(IMAGE_PACKAGES)}"


def test_tinydata_is_deterministic_and_needs_no_training_stack(tmp_path):
    first = write_tiny_dataset("alpaca", tmp_path / "a.jsonl", n=32, seed=3).read_bytes()
    assert write_tiny_dataset("alpaca", tmp_path / "b.jsonl", n=32, seed=3).read_bytes() == first
    assert write_tiny_dataset("alpaca", tmp_path / "c.jsonl", n=32, seed=4).read_bytes() != first
    probe = "import sys, recipekit.tinydata; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_tinydata_formats_are_valid_and_vary_in_length(train, tmp_path):
    for fmt, name in (("alpaca", "a.jsonl"), ("messages", "m.jsonl"), ("text", "t.jsonl")):
        path = write_tiny_dataset(fmt, tmp_path / name, n=40)
        assert train.validate_data_file(path, fmt) == 40
        lengths = {len(line) for line in path.read_text().splitlines()}
        assert max(lengths) > 2 * min(lengths)
    corpus = write_tiny_dataset("text", tmp_path / "corpus", n=40)
    files = train.data_files(corpus, "text")
    assert len(files) == 3 and all(f.suffix == ".txt" for f in files)
    assert sum(f.read_text().count("\n\n") + 1 for f in files) == 40  # paragraphs = samples


# ----------------------------------------------------------------------------------------------- run config
def test_recipe_yaml_without_its_sections_is_a_one_line_error(train, tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("recipe: {}\n")
    with pytest.raises(train.RunError, match="lacks section.*plan, training_arguments"):
        train.load_run_config(path)
    with pytest.raises(train.RunError, match="cannot read recipe"):
        train.load_run_config(tmp_path / "missing.yaml")


def test_an_ascend_bundle_adapts_to_cpu_and_says_so(train, tmp_path):
    planned = {"ddp_backend": "hccl", "optim": "adamw_torch_npu_fused", "fp16": True, "bf16": False}
    cpu = train.Device("cpu", "gloo", bf16=True)
    args, notes = train.adapt_training_arguments(planned, cpu, tmp_path, world_size=1, planned_world_size=1)
    assert args["ddp_backend"] == "gloo" and args["optim"] == "adamw_torch" and args["use_cpu"] is True
    assert args["bf16"] is True and args["fp16"] is False
    assert len(notes) == 3 and any("hccl" in n for n in notes) and any("fp16" in n for n in notes)
    same, none = train.adapt_training_arguments(args, cpu, tmp_path, world_size=1, planned_world_size=1)
    assert none == [] and same["optim"] == "adamw_torch"


def test_a_cuda_without_bf16_trains_in_fp16(train, tmp_path):
    old_gpu = train.Device("cuda", "nccl", bf16=False)
    args, notes = train.adapt_training_arguments({"bf16": True, "optim": "adamw_torch_fused"}, old_gpu, tmp_path, 1, 1)
    assert args["fp16"] and not args["bf16"] and "use_cpu" not in args and len(notes) == 1


def test_deepspeed_config_is_resolved_next_to_the_recipe_and_follows_the_trainer(train, tmp_path):
    (tmp_path / "ds_config.json").write_text(
        json.dumps(
            {"train_batch_size": 4, "fp16": {"enabled": True, "loss_scale": 0}, "zero_optimization": {"stage": 2}}
        )
    )
    planned = {"deepspeed": "ds_config.json", "fp16": True, "bf16": False}
    args, notes = train.adapt_training_arguments(
        planned, train.Device("cpu", "gloo", True), tmp_path, world_size=1, planned_world_size=2
    )
    config = args["deepspeed"]
    assert config["bf16"] == {"enabled": True} and "fp16" not in config  # matches the Trainer's fp16 → bf16
    assert config["train_batch_size"] == "auto" and any("world size is 1" in n for n in notes)
    with pytest.raises(train.RunError, match="DeepSpeed config"):
        train.adapt_training_arguments({"deepspeed": "nope.json"}, train.Device("cpu", "gloo", True), tmp_path, 1, 1)


def test_weights_are_half_precision_only_where_a_master_copy_exists(train):
    assert train.weight_dtype("bf16", "sft", deepspeed=False) is torch.float32  # AMP keeps no master copy
    assert train.weight_dtype("bf16", "sft", deepspeed=True) is torch.bfloat16
    assert train.weight_dtype("fp16", "lora", deepspeed=False) is torch.float16  # frozen base
    assert train.weight_dtype("fp32", "lora", deepspeed=True) is torch.float32


def test_qlora_falls_back_to_lora_where_4bit_cannot_load_and_says_so(train, caplog):
    qlora = SimpleNamespace(kind="qlora", quant=SimpleNamespace(quant_type="nf4", double_quant=True))
    caplog.set_level("INFO", logger="train")
    assert train.quantization_config(qlora, train.Device("cpu", "gloo", True), torch.bfloat16) is None
    assert "training plain LoRA" in caplog.text
    assert train.quantization_config(SimpleNamespace(kind="lora"), train.Device("cuda", "nccl", True), None) is None


# ----------------------------------------------------------------------------------------------- bad data
@pytest.mark.parametrize(
    "fmt, lines, expected",
    [
        ("alpaca", ['{"instruction": "a", "output": "b"}', "{not json"], r":2: not valid JSON"),
        ("alpaca", ['{"instruction": "a", "output": "b"}', '{"instruction": "a"}'], r":2: field 'output': missing"),
        ("alpaca", ['{"instruction": 3, "output": "b"}'], r":1: field 'instruction': must be a string, got int"),
        ("alpaca", ['["a", "b"]'], r":1: expected a JSON object"),
        ("messages", ['{"messages": []}'], r":1: field 'messages': must be a non-empty list"),
        (
            "messages",
            ['{"messages": [{"role": "user", "content": "hi"}, {"role": "bot", "content": "x"}]}'],
            r"field 'messages\[1\].role': role must be one of",
        ),
        ("messages", ['{"messages": [{"role": "user", "content": "hi"}]}'], r"no assistant turn"),
        (
            "messages",
            ['{"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]}'],
            r"field 'messages\[0\].content'",
        ),
        ("text", ['{"body": "x"}'], r":1: field 'text': missing"),
        ("alpaca", [], r"file is empty"),
        ("alpaca", ["", "  "], r"holds no records"),
        (
            "alpaca",
            ['{"instruction": "a", "output": "b"}', '{"instruction": "\udcff", "output": "b"}'],
            r":2: not UTF-8 text",
        ),
    ],
)
def test_bad_data_names_file_line_and_field(train, tmp_path, fmt, lines, expected):
    path = tmp_path / "data.jsonl"
    path.write_bytes(("\n".join(lines) + ("\n" if lines else "")).encode("utf-8", "surrogateescape"))
    with pytest.raises(train.DataError, match=expected) as raised:
        train.validate_data_file(path, fmt)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_data_directory_without_data_files_is_an_error(train, tmp_path):
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(train.DataError, match="no .jsonl files"):
        train.data_files(tmp_path, "alpaca")
    with pytest.raises(train.DataError, match="does not exist"):
        train.data_files(tmp_path / "absent", "text")


# ---------------------------------------------------------------------------------------------- tokenizer
def test_the_twin_tokenizer_is_deterministic_and_chat_ready(train, tokenizer):
    again = train.train_tokenizer([m for m in ["the red fox", "1 2 3"] * 50], 512, 512)
    assert (
        again.backend_tokenizer.to_str()
        == train.train_tokenizer(["the red fox", "1 2 3"] * 50, 512, 512).backend_tokenizer.to_str()
    )
    assert len(tokenizer) <= 512 and tokenizer.pad_token_id is not None
    assert tokenizer.pad_token_id not in (tokenizer.eos_token_id, tokenizer.bos_token_id)
    text = train.render_chat(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    assert text == "<|bos|><|user|>\nhi<|eos|><|assistant|>\nyo<|eos|>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_tokens_to_ids("<|assistant|>") in ids  # role markers are single tokens
    assert tokenizer.decode(tokenizer("dog 12 ßü", add_special_tokens=False)["input_ids"]) == "dog 12 ßü"


# ------------------------------------------------------------------------------------------------ masking
def _trained_text(tokenizer, sample):
    return tokenizer.decode([t for t in sample["labels"] if t != -100])


def test_prompt_tokens_are_masked_token_by_token(train, tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Count from 1 to 3."},
        {"role": "assistant", "content": "1 2 3"},
        {"role": "user", "content": "Spell cat backwards."},
        {"role": "assistant", "content": "tac"},
    ]
    sample = train.encode_conversation(tokenizer, messages, max_len=512)
    ids, labels = sample["input_ids"], sample["labels"]
    assert len(ids) == len(labels)
    text = train.render_chat(tokenizer, messages)
    spans = train.assistant_spans(tokenizer, messages, text)
    assert [text[s:e] for s, e in spans] == ["1 2 3<|eos|>", "tac<|eos|>"]
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    for token, label, (start, _) in zip(ids, labels, offsets):
        in_answer = any(s <= start < e for s, e in spans)
        assert label == (token if in_answer else -100), f"token {tokenizer.decode([token])!r} at {start}"
    assert _trained_text(tokenizer, sample) == "1 2 3<|eos|>tac<|eos|>"


def test_alpaca_records_become_one_exchange(train, tokenizer):
    batch = {"instruction": ["Repeat the word."], "input": ["dog 2"], "output": ["dog dog"]}
    (messages,) = train.conversations(batch, "alpaca")
    assert messages == [
        {"role": "user", "content": "Repeat the word.\n\ndog 2"},
        {"role": "assistant", "content": "dog dog"},
    ]
    out = train.tokenize_conversations(batch, tokenizer, "alpaca", max_len=512)
    assert _trained_text(tokenizer, {"labels": out["labels"][0]}) == "dog dog<|eos|>"


def test_truncation_keeps_max_len_and_drops_samples_with_no_answer_left(train, tokenizer):
    batch = {
        "instruction": ["Count from 0 to 30.", "word " * 200],
        "input": ["", ""],
        "output": [" ".join(str(i) for i in range(31)), "x"],
    }
    out = train.tokenize_conversations(batch, tokenizer, "alpaca", max_len=24)
    assert len(out["input_ids"]) == 1  # the second answer starts beyond 24 tokens
    assert len(out["input_ids"][0]) == 24 and any(t != -100 for t in out["labels"][0])


def test_pretraining_text_becomes_full_blocks_separated_by_eos(train, tokenizer):
    batch = {"text": ["the red fox " * 5, "", "1 2 3 4 5 " * 7]}
    out = train.tokenize_into_blocks(batch, tokenizer, block_len=8)
    stream = [
        t
        for doc in ("the red fox " * 5, "1 2 3 4 5 " * 7)
        for t in tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ]
    assert all(len(block) == 8 for block in out["input_ids"])
    assert [t for block in out["input_ids"] for t in block] == stream[: len(stream) // 8 * 8]


# ------------------------------------------------------------------------------------------------ packing
def _samples(train, tokenizer, tmp_path, n=12):
    path = write_tiny_dataset("messages", tmp_path / "chat.jsonl", n=n, seed=7)
    batch = {"messages": [json.loads(line)["messages"] for line in path.read_text().splitlines()]}
    return train.tokenize_conversations(batch, tokenizer, "messages", max_len=128)


def test_packing_fills_rows_without_losing_or_mixing_tokens(train, tokenizer, tmp_path):
    samples = _samples(train, tokenizer, tmp_path, n=40)
    packed = train.pack_samples(samples, max_len=128)
    assert len(packed["input_ids"]) < len(samples["input_ids"]) / 2
    assert all(len(row) <= 128 for row in packed["input_ids"])
    assert sorted(t for row in packed["input_ids"] for t in row) == sorted(t for s in samples["input_ids"] for t in s)
    for ids, labels, positions in zip(packed["input_ids"], packed["labels"], packed["position_ids"]):
        starts = [i for i, p in enumerate(positions) if p == 0]
        assert starts[0] == 0 and all(labels[i] == -100 for i in starts)  # nothing predicted across a boundary
        assert len(ids) == len(labels) == len(positions)


def test_packed_rows_give_each_sample_the_loss_it_has_alone(train, tokenizer, tmp_path):
    torch.manual_seed(0)
    spec = SimpleNamespace(
        family="llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_attention_heads=4,
        num_kv_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        attention_bias=False,
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(train.architecture_config(spec, tokenizer)).eval()
    samples = _samples(train, tokenizer, tmp_path, n=6)
    collate = train.SequenceCollator(tokenizer.pad_token_id)
    alone = [
        _token_losses(model, collate([{"input_ids": ids, "labels": labels}]))[0].sum()
        for ids, labels in zip(samples["input_ids"], samples["labels"])
    ]
    packed = train.pack_samples(samples, max_len=512)
    assert len(packed["input_ids"]) == 1
    batch = collate([{key: packed[key][0] for key in packed}])
    assert "attention_mask" not in batch and "position_ids" in batch
    losses = _token_losses(model, batch)[0]
    order = sorted(range(6), key=lambda i: -len(samples["input_ids"][i]))  # the packer's best-fit-decreasing order
    offset = 0
    for index in order:
        length = len(samples["input_ids"][index])
        assert torch.allclose(losses[offset : offset + length - 1].sum(), alone[index], rtol=1e-4, atol=1e-4)
        offset += length


def _token_losses(model, batch):
    """Per-position loss: position t predicts token t+1 (the model's own shift)."""
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:], ignore_index=-100, reduction="none"
    )


def test_collator_pads_right_and_masks_padding(train):
    collate = train.SequenceCollator(pad_token_id=0)
    batch = collate([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    blocks = collate([{"input_ids": [1, 2]}, {"input_ids": [3, 4]}])  # pretraining blocks: labels are the ids
    assert set(blocks) == {"input_ids", "labels"} and blocks["labels"].tolist() == [[1, 2], [3, 4]]
    packed = collate(
        [
            {"input_ids": [1, 2, 3], "labels": [-100, 2, 3], "position_ids": [0, 0, 1]},
            {"input_ids": [4], "labels": [4], "position_ids": [0]},
        ]
    )
    assert packed["position_ids"].tolist() == [[0, 0, 1], [0, 0, 1]] and "attention_mask" not in packed
    assert packed["labels"].tolist()[1] == [4, -100, -100]


# -------------------------------------------------------------------------------------------- checkpoints
def _checkpoint(root: Path, step: int, *, state="{}", weights=True) -> Path:
    from safetensors.torch import save_file

    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(state)
    if weights:
        save_file({"w": torch.ones(64, 64)}, str(path / "model.safetensors"))
    return path


def test_resume_auto_takes_the_newest_complete_checkpoint(train, tmp_path, caplog):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 10)
    truncated = _checkpoint(tmp_path, 12)
    os.truncate(truncated / "model.safetensors", 5000)
    _checkpoint(tmp_path, 14, state='{"global_step": 1')  # cut while writing the state
    _checkpoint(tmp_path, 16, weights=False)
    caplog.set_level("INFO", logger="train")
    assert train.resume_checkpoint(tmp_path, "auto") == str(tmp_path / "checkpoint-10")
    skipped = caplog.text
    assert "checkpoint-16: no model weights" in skipped and "checkpoint-14: trainer_state.json" in skipped
    assert "checkpoint-12: model.safetensors truncated" in skipped and "checkpoint-2" not in skipped


def test_resume_none_explicit_and_empty(train, tmp_path):
    assert train.resume_checkpoint(tmp_path, "auto") is None
    good = _checkpoint(tmp_path, 3)
    assert train.resume_checkpoint(tmp_path, "none") is None
    assert train.resume_checkpoint(tmp_path, str(good)) == str(good)
    broken = _checkpoint(tmp_path, 4, weights=False)
    with pytest.raises(train.RunError, match="no model weights"):
        train.resume_checkpoint(tmp_path, str(broken))


def test_a_sharded_checkpoint_needs_every_shard(train, tmp_path):
    path = _checkpoint(tmp_path, 5, weights=False)
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "s-1.safetensors"}}))
    assert train.checkpoint_problem(path) == "shard s-1.safetensors missing"


# -------------------------------------------------------------------------------------------- callbacks
def test_flops_per_token_is_6n_plus_attention(train):
    assert train.flops_per_token(1_000_000, layers=2, hidden=64, seq_len=128) == 6_000_000 + 12 * 2 * 64 * 128


def test_throughput_adds_per_device_figures_to_training_logs(train, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(train, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    callback = train.ThroughputCallback(flops_per_token=1_000_000, peak_tflops=2.0, world_size=2)
    state = SimpleNamespace(num_input_tokens_seen=1000)
    callback.on_train_begin(None, state, None)
    clock[0], state.num_input_tokens_seen = 102.0, 9000  # 8000 tokens in 2 s on 2 devices
    logs = {"loss": 1.0}
    callback.on_log(None, state, None, logs=logs)
    assert logs["tokens_per_second_per_device"] == 2000.0
    assert logs["tflops_per_device"] == pytest.approx(0.002) and logs["mfu"] == pytest.approx(0.001)
    summary = {"train_runtime": 3.0}
    callback.on_log(None, state, None, logs=summary)
    assert summary == {"train_runtime": 3.0}


def test_sigterm_requests_a_checkpoint_and_a_stop(train):
    from transformers import TrainerControl

    callback = train.PreemptionCallback()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        callback.install()
        control = TrainerControl()
        callback.on_step_end(SimpleNamespace(device="cpu"), SimpleNamespace(global_step=6), control)
        assert not control.should_save and not control.should_training_stop
        os.kill(os.getpid(), signal.SIGTERM)
        callback.on_step_end(SimpleNamespace(device="cpu"), SimpleNamespace(global_step=7), control)
        assert control.should_save and control.should_training_stop and callback.stopped_at == 7
    finally:
        signal.signal(signal.SIGTERM, previous)


_LEAVE_SCRIPT = """
import importlib.util, os, sys, time
import torch.distributed as dist
spec = importlib.util.spec_from_file_location("bundle_train", sys.argv[1])
train = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = train
spec.loader.exec_module(train)
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(1.5)  # the slow rank, still busy after rank 0 is done
start = time.monotonic()
train.leave_process_group()
print(f"rank {os.environ['RANK']} waited {time.monotonic() - start:.2f} initialized={dist.is_initialized()}")
"""


@pytest.mark.slow
def test_no_rank_leaves_the_process_group_before_the_others(tmp_path: Path) -> None:
    """A rank that finishes first waits for the slow one, then all tear the group down (no SIGABRT on the slow one)."""
    script = tmp_path / "leave.py"
    script.write_text(_LEAVE_SCRIPT)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(TRAIN_PY)],
            env={**env, "RANK": str(rank), "LOCAL_RANK": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [process.communicate(timeout=120) for process in ranks]
    assert [process.returncode for process in ranks] == [0, 0], outputs
    waited = {line.split()[1]: line for out, _ in outputs for line in out.splitlines() if line.startswith("rank")}
    assert float(waited["0"].split()[3]) >= 1.0 and "initialized=False" in waited["0"], waited
    assert "initialized=False" in waited["1"], waited
