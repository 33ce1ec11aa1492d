"""A restart continues at the exact sample: the real Trainer on prepared shards, stopped and resumed mid-epoch.

The run trains a tiny random Llama on prepared tiny data (shards.py) through the bundle's Trainer (sampler.py's
PreparedTrainer) and records every micro-batch the model is given. A second Trainer resumes from the midway
checkpoint, as train.py does after a restart, and must be given exactly the micro-batches the first run trained on
after that checkpoint, token by token — mid-epoch, with gradient accumulation, across an epoch boundary. Slow: the
Trainer runs twice on CPU (about 20 s on 2 cores).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recipekit.validate.dryrun.workdir.tinydata import write_tiny_dataset

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from recipekit.runtime.boundary import recipeview  # noqa: E402
from recipekit.runtime.data import samples, workers  # noqa: E402
from recipekit.runtime.data.fingerprint import Settings  # noqa: E402
from recipekit.runtime.data.sampler import PreparedTrainer  # noqa: E402
from recipekit.runtime.data.shards import ShardDataset  # noqa: E402
from recipekit.runtime.data.sources import find_files  # noqa: E402
from recipekit.runtime.model import twin  # noqa: E402
from recipekit.runtime.session import rundata  # noqa: E402

pytestmark = pytest.mark.slow


def prepared(tmp_path: Path, tokenizer) -> ShardDataset:
    data = write_tiny_dataset("alpaca", tmp_path / "data.jsonl", n=22, seed=3)
    settings = Settings("alpaca", 64, False, 0.0, 0, 1 << 20, 0, "stat")
    job = rundata.describe_job(settings, find_files(str(data), "alpaca"), tokenizer, tmp_path / "prepared")
    workers.work(job, tokenizer, 0, 1)
    return ShardDataset(job.directory, workers.collect(job, merger=True), "train")


def train(dataset: ShardDataset, tokenizer, output: Path, resume: str | None) -> list[torch.Tensor]:
    """Train (or resume) to step 9; return the input_ids of every micro-batch the model saw, in order."""
    spec = recipeview.ModelView(
        name="tiny",
        name_or_path="",
        init="random",
        trust_remote_code=False,
        family="llama",
        num_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        num_kv_heads=1,
        head_dim_override=0,
        intermediate_size=64,
        vocab_size=512,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        attention_bias=False,
        num_experts=0,
        experts_per_token=0,
        moe_intermediate_size=0,
        router_aux_loss_coef=0.0,
        router_aux_loss=False,
    )
    torch.manual_seed(0)
    model = twin.random_model(spec, tokenizer)
    seen: list[torch.Tensor] = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].clone()), with_kwargs=True)
    args = transformers.TrainingArguments(
        output_dir=str(output),
        use_cpu=True,
        report_to="none",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=9,
        save_strategy="steps",
        save_steps=4,
        logging_steps=1,
        seed=5,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    trainer = PreparedTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        data_collator=samples.SequenceCollator(tokenizer.pad_token_id),
    )
    trainer.train(resume_from_checkpoint=resume)
    return seen


def test_a_restart_resumes_at_the_exact_sample(tmp_path: Path) -> None:
    tokenizer = twin.train_tokenizer(["Count from 1 to 9.", "red blue green", "dog cat fish"] * 30, 512, 128)
    dataset = prepared(tmp_path, tokenizer)
    assert len(dataset) == 22  # 11 micro-batches an epoch: step 4 ends mid-epoch, step 9 lies in the second epoch
    whole = train(dataset, tokenizer, tmp_path / "run", None)
    assert len(whole) == 9 * 2 - 1  # the epoch's last step has one micro-batch (11 = 5 × 2 + 1)
    resumed = train(dataset, tokenizer, tmp_path / "run", str(tmp_path / "run" / "checkpoint-4"))
    assert len(resumed) == len(whole) - 8
    for ours, theirs in zip(resumed, whole[8:], strict=True):
        assert torch.equal(ours, theirs)
    # and the order really is shuffled, differently per epoch
    first_epoch = torch.cat([b.flatten() for b in whole[:11]])
    second_epoch = torch.cat([b.flatten() for b in whole[11:]])
    assert not torch.equal(first_epoch[: second_epoch.numel()], second_epoch)
