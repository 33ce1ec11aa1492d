"""The Megatron engine's room: Megatron-Bridge's own ``pretrain()``/``finetune()`` started from a bundle's recipe.yaml
(``torchrun ... -m runtime.megatron.train --recipe recipe.yaml --resume auto``). Shipped in that engine's bundles only.
"""
