"""What `recipekit model import` measures with torch on the architecture itself, stored in the option as numbers.

The training FLOPs per token (torch's FLOP counter on the meta device, or on the CPU where a module cannot run on
meta, :mod:`.modelflops`) and the activation memory per token (torch's memory tracker under fake tensors, one layer
of each kind, :mod:`.modelmemory`). torch is imported inside their functions: the plan and ``build`` read the stored
numbers and the counting conventions only.
"""
