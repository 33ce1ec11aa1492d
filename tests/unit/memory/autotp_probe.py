"""What DeepSpeed AutoTP really does to a small Llama and Qwen2, measured on one rank of a 2-process gloo group.

Started twice by tests/unit/memory/test_memory_tp.py (RANK 0 and 1, a free MASTER_PORT); rank 0 prints one JSON line:
for each case, the parameters the rank holds after ``deepspeed.initialize`` (AutoTP applied), each module's
class and weight shape, and the bytes autograd keeps for one bf16 forward (weights excluded), the way
test_memory.py measures them without TP.
"""

from __future__ import annotations

import json
import os
import sys

import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import transformers  # noqa: E402

TP = 2
SHAPE = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2)
VOCAB, SEQ, BATCH = 1000, 96, 2
CASES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"tie_word_embeddings": False}),
    "qwen2-tied": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {"tie_word_embeddings": True}),
}


def saved_bytes(net: torch.nn.Module) -> int:
    """Bytes of the tensors autograd keeps during one forward, weights (and their views) excluded."""
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(input_ids=ids, labels=ids)
    return sum(kept.values())


def measure(name: str) -> dict:
    config_class, model_class, extra = CASES[name]
    torch.manual_seed(0)
    config = config_class(vocab_size=VOCAB, max_position_embeddings=1024, use_cache=False, **SHAPE, **extra)
    net = model_class(config)
    ds = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 1},
        "bf16": {"enabled": True},
        "tensor_parallel": {"autotp_size": TP},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    # torch's AdamW, not DeepSpeed's: on CPU that one is an op compiled with g++ (a minute or two), and the
    # optimizer plays no part in what the probe measures (the shapes AutoTP gives, the activations autograd keeps)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=net, config=ds, optimizer=optimizer)
    module = engine.module
    modules = {
        n: [type(m).__name__, list(m.weight.shape)]
        for n, m in module.named_modules()
        if isinstance(getattr(m, "weight", None), torch.Tensor) and ("layers." not in n or "layers.0." in n)
    }
    module.train()
    return {
        "params": sum(p.numel() for p in module.parameters()),
        "modules": modules,
        "saved_bytes": saved_bytes(module),
        "dtype": str(next(module.parameters()).dtype),
    }


def main() -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    found = {name: measure(name) for name in CASES}
    if torch.distributed.get_rank() == 0:
        sys.stdout.write("\nPROBE " + json.dumps(found) + "\n")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
