"""The model a run trains: a pretrained one loaded in the right dtype (4-bit, LoRA), or the random twin made
from its config and a tokenizer trained on the run's data.
"""
