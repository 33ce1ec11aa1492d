"""The runtime's data path without the Trainer: validation, the twin's tokenizer, masking, packing, collation.

The modules are imported as ``recipekit.runtime.*``; in a bundle the same files run as ``runtime.*``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from recipekit.validate.dryrun.workdir.tinydata import tiny_records, write_tiny_dataset

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from recipekit.runtime.data import chat, records, samples, sources  # noqa: E402
from recipekit.runtime.model import twin  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The random twin's tokenizer, trained on the tiny chat data as a run would."""
    path = write_tiny_dataset("messages", tmp_path_factory.mktemp("tok") / "chat.jsonl")
    texts = [m["content"] for line in path.read_text().splitlines() for m in json.loads(line)["messages"]]
    return twin.train_tokenizer(texts, vocab_size=512, max_length=512)


# ----------------------------------------------------------------------------------------------- tiny data
def records_of(path, fmt, chunk_bytes=1 << 20):
    """Every item of the data at ``path``, chunk by chunk (sources.py), and the first problem as a DataError."""
    files = sources.find_files(str(path), fmt)
    items = [i for c in sources.plan_chunks(files, chunk_bytes) for i in sources.read_chunk(files[c.file], c, fmt)]
    for item in items:
        problem = item.checked(fmt)
        if problem is not None:
            raise records.DataError(item.locate(), problem[0], field=problem[1])
    return [item.record for item in items]


def test_tinydata_is_deterministic_and_needs_no_training_stack(tmp_path):
    first = write_tiny_dataset("alpaca", tmp_path / "a.jsonl", n=32, seed=3).read_bytes()
    assert write_tiny_dataset("alpaca", tmp_path / "b.jsonl", n=32, seed=3).read_bytes() == first
    assert write_tiny_dataset("alpaca", tmp_path / "c.jsonl", n=32, seed=4).read_bytes() != first
    probe = (
        "import sys, recipekit.validate.dryrun.workdir.tinydata; "
        "print(sorted({'torch', 'transformers', 'pyarrow'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_tinydata_formats_are_valid_and_vary_in_length(tmp_path):
    for fmt, name in (("alpaca", "a.jsonl"), ("messages", "m.jsonl"), ("text", "t.jsonl")):
        path = write_tiny_dataset(fmt, tmp_path / name, n=40)
        assert len(records_of(path, fmt)) == 40
        lengths = {len(line) for line in path.read_text().splitlines()}
        assert max(lengths) > 2 * min(lengths)
    corpus = write_tiny_dataset("text", tmp_path / "corpus", n=40)
    files = sources.find_files(str(corpus), "text")
    assert len(files) == 3 and all(f.kind == "text" for f in files)
    assert sum(f.path.read_text().count("\n\n") + 1 for f in files) == 40  # paragraphs = samples
    assert sorted(r["text"] for r in records_of(corpus, "text")) == sorted(r["text"] for r in tiny_records("text", 40))


# ----------------------------------------------------------------------------------------------- bad data
@pytest.mark.parametrize(
    "fmt, lines, expected",
    [
        ("alpaca", ['{"instruction": "a", "output": "b"}', "{not json"], r":2: not valid JSON"),
        ("alpaca", ['{"instruction": "a", "output": "b"}', '{"instruction": "a"}'], r":2: field 'output': missing"),
        ("alpaca", ['{"instruction": 3, "output": "b"}'], r":1: field 'instruction': must be a string, got int"),
        ("alpaca", ['{"instruction": null, "output": "b"}'], r":1: field 'instruction': missing"),
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
        (
            "alpaca",
            ['{"instruction": "a", "output": "b"}', '{"instruction": "\udcff", "output": "b"}'],
            r":2: not UTF-8 text",
        ),
    ],
)
def test_bad_data_names_file_line_and_field(tmp_path, fmt, lines, expected):
    path = tmp_path / "data.jsonl"
    path.write_bytes(("\n".join(lines) + ("\n" if lines else "")).encode("utf-8", "surrogateescape"))
    with pytest.raises(records.DataError, match=expected) as raised:
        records_of(path, fmt)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_line_numbers_count_from_the_file_start_in_every_chunk(tmp_path):
    path = write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=300)
    lines = path.read_text().splitlines()
    lines[250] = '{"instruction": "x"}'
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(records.DataError, match=r"data.jsonl:251: field 'output': missing"):
        records_of(path, "alpaca", chunk_bytes=2000)  # line 251 lies in a later chunk


def test_a_data_directory_without_data_files_is_an_error(tmp_path):
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(records.DataError, match="directory holds no .jsonl or .json or .parquet or .arrow files"):
        sources.find_files(str(tmp_path), "alpaca")
    with pytest.raises(records.DataError, match="does not exist"):
        sources.find_files(str(tmp_path / "absent"), "text")
    with pytest.raises(records.DataError, match="the pattern matches no file"):
        sources.find_files(str(tmp_path / "*.jsonl"), "alpaca")


# ---------------------------------------------------------------------------------------------- tokenizer
def test_the_twin_tokenizer_is_deterministic_and_chat_ready(tokenizer):
    again = twin.train_tokenizer([m for m in ["the red fox", "1 2 3"] * 50], 512, 512)
    assert (
        again.backend_tokenizer.to_str()
        == twin.train_tokenizer(["the red fox", "1 2 3"] * 50, 512, 512).backend_tokenizer.to_str()
    )
    assert len(tokenizer) <= 512 and tokenizer.pad_token_id is not None
    assert tokenizer.pad_token_id not in (tokenizer.eos_token_id, tokenizer.bos_token_id)
    text = chat.render_chat(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    assert text == "<|bos|><|user|>\nhi<|eos|><|assistant|>\nyo<|eos|>"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_tokens_to_ids("<|assistant|>") in ids  # role markers are single tokens
    assert tokenizer.decode(tokenizer("dog 12 ßü", add_special_tokens=False)["input_ids"]) == "dog 12 ßü"


# ------------------------------------------------------------------------------------------------ masking
def _trained_text(tokenizer, sample):
    return tokenizer.decode([t for t in sample["labels"] if t != -100])


def encode_alone(tokenizer: Any, messages: list[dict[str, str]], max_len: int) -> dict[str, list[int]]:
    """The reference: one conversation encoded on its own, token by token (the runtime encodes a batch at once):
    labels are -100 on every prompt token; truncated to max_len."""
    text = chat.render_chat(tokenizer, messages)
    spans = chat.assistant_spans(tokenizer, messages, text)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"][:max_len]
    labels = [
        token if any(s <= start < e for s, e in spans) else samples.IGNORE_INDEX
        for token, (start, _) in zip(ids, encoded["offset_mapping"])
    ]
    return {"input_ids": ids, "labels": labels}


def test_prompt_tokens_are_masked_token_by_token(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Count from 1 to 3."},
        {"role": "assistant", "content": "1 2 3"},
        {"role": "user", "content": "Spell cat backwards."},
        {"role": "assistant", "content": "tac"},
    ]
    sample = encode_alone(tokenizer, messages, max_len=512)
    ids, labels = sample["input_ids"], sample["labels"]
    assert len(ids) == len(labels)
    text = chat.render_chat(tokenizer, messages)
    spans = chat.assistant_spans(tokenizer, messages, text)
    assert [text[s:e] for s, e in spans] == ["1 2 3<|eos|>", "tac<|eos|>"]
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    for token, label, (start, _) in zip(ids, labels, offsets):
        in_answer = any(s <= start < e for s, e in spans)
        assert label == (token if in_answer else -100), f"token {tokenizer.decode([token])!r} at {start}"
    assert _trained_text(tokenizer, sample) == "1 2 3<|eos|>tac<|eos|>"


def test_a_batch_is_encoded_as_each_record_alone(tokenizer, tmp_path):
    """tokenize_conversations (one tokenizer call per batch, masks by span search) equals each record encoded alone."""
    records = tiny_records("messages", 120, seed=9)  # system turns, one or two exchanges
    batch = {"messages": [r["messages"] for r in records]}
    out = samples.tokenize_conversations(batch, tokenizer, "messages", max_len=16)  # truncation too
    alone = [encode_alone(tokenizer, m, 16) for m in chat.conversations(batch, "messages")]
    kept = [a for a in alone if any(label != -100 for label in a["labels"])]
    assert 0 < len(kept) < len(alone)  # some answers lie beyond 16 tokens: dropped alike
    assert out == {"input_ids": [a["input_ids"] for a in kept], "labels": [a["labels"] for a in kept]}


def test_alpaca_records_become_one_exchange(tokenizer):
    batch = {"instruction": ["Repeat the word."], "input": ["dog 2"], "output": ["dog dog"]}
    (messages,) = chat.conversations(batch, "alpaca")
    assert messages == [
        {"role": "user", "content": "Repeat the word.\n\ndog 2"},
        {"role": "assistant", "content": "dog dog"},
    ]
    out = samples.tokenize_conversations(batch, tokenizer, "alpaca", max_len=512)
    assert _trained_text(tokenizer, {"labels": out["labels"][0]}) == "dog dog<|eos|>"


def test_truncation_keeps_max_len_and_drops_samples_with_no_answer_left(tokenizer):
    batch = {
        "instruction": ["Count from 0 to 30.", "word " * 200],
        "input": ["", ""],
        "output": [" ".join(str(i) for i in range(31)), "x"],
    }
    out = samples.tokenize_conversations(batch, tokenizer, "alpaca", max_len=24)
    assert len(out["input_ids"]) == 1  # the second answer starts beyond 24 tokens
    assert len(out["input_ids"][0]) == 24 and any(t != -100 for t in out["labels"][0])


def test_pretraining_text_becomes_full_blocks_separated_by_eos(tokenizer):
    batch = {"text": ["the red fox " * 5, "", "1 2 3 4 5 " * 7]}
    out = samples.tokenize_into_blocks(batch, tokenizer, block_len=8)
    stream = [
        t
        for doc in ("the red fox " * 5, "1 2 3 4 5 " * 7)
        for t in tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ]
    assert all(len(block) == 8 for block in out["input_ids"])
    assert [t for block in out["input_ids"] for t in block] == stream[: len(stream) // 8 * 8]


# ------------------------------------------------------------------------------------------------ packing
def _samples(tokenizer, tmp_path, n=12):
    path = write_tiny_dataset("messages", tmp_path / "chat.jsonl", n=n, seed=7)
    batch = {"messages": [json.loads(line)["messages"] for line in path.read_text().splitlines()]}
    return samples.tokenize_conversations(batch, tokenizer, "messages", max_len=128)


def test_packing_fills_rows_without_losing_or_mixing_tokens(tokenizer, tmp_path):
    encoded = _samples(tokenizer, tmp_path, n=40)
    packed = samples.pack_samples(encoded, max_len=128)
    assert len(packed["input_ids"]) < len(encoded["input_ids"]) / 2
    assert all(len(row) <= 128 for row in packed["input_ids"])
    assert sorted(t for row in packed["input_ids"] for t in row) == sorted(t for s in encoded["input_ids"] for t in s)
    for ids, labels, positions in zip(packed["input_ids"], packed["labels"], packed["position_ids"]):
        starts = [i for i, p in enumerate(positions) if p == 0]
        assert starts[0] == 0 and all(labels[i] == -100 for i in starts)  # nothing predicted across a boundary
        assert len(ids) == len(labels) == len(positions)


def test_packed_rows_give_each_sample_the_loss_it_has_alone(tokenizer, tmp_path):
    torch.manual_seed(0)
    spec = SimpleNamespace(
        family="llama",
        config=None,  # the hand-made twin's fields, not an imported architecture's config
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
        head_dim_override=0,
        num_experts=0,
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(twin.architecture_config(spec, tokenizer)).eval()
    encoded = _samples(tokenizer, tmp_path, n=6)
    collate = samples.SequenceCollator(tokenizer.pad_token_id)
    alone = [
        _token_losses(model, collate([{"input_ids": ids, "labels": labels}]))[0].sum()
        for ids, labels in zip(encoded["input_ids"], encoded["labels"])
    ]
    packed = samples.pack_samples(encoded, max_len=512)
    assert len(packed["input_ids"]) == 1
    batch = collate([{key: packed[key][0] for key in packed}])
    assert "attention_mask" not in batch and "position_ids" in batch
    losses = _token_losses(model, batch)[0]
    order = sorted(range(6), key=lambda i: -len(encoded["input_ids"][i]))  # the packer's best-fit-decreasing order
    offset = 0
    for index in order:
        length = len(encoded["input_ids"][index])
        assert torch.allclose(losses[offset : offset + length - 1].sum(), alone[index], rtol=1e-4, atol=1e-4)
        offset += length


def _token_losses(model, batch):
    """Per-position loss: position t predicts token t+1 (the model's own shift)."""
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:], ignore_index=-100, reduction="none"
    )


def test_collator_pads_right_and_masks_padding():
    collate = samples.SequenceCollator(pad_token_id=0)
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
