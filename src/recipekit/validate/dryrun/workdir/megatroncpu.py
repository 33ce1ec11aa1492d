"""DRY RUN ONLY: Megatron-Bridge 0.3.1 and Megatron-core 0.16.1 redirected from CUDA to the CPU, so that a bundle of
the Megatron engine trains its tiny twin with gloo on the dry run's CPU. Never in an image, never in a bundle.

Megatron-core and Megatron-Bridge assume a CUDA device: their schedules, data-parallel buffers, pipeline sends and MoE
dispatch allocate on ``"cuda"`` (235 such sites in mcore 0.16.1), Bridge asserts ``torch.cuda.is_available()``,
seeds its model-parallel RNG tracker only with a CUDA device, and its PEFT modules import Transformer Engine (a CUDA
library) unconditionally. There is no setting that avoids them (docs/engines.md has the study). This module does what
MindSpeed's ``transfer_to_npu`` does for Ascend, towards the CPU:

* **torch level** (:func:`_redirect_torch`): tensor factories and ``Tensor.to``/``.cuda`` given a CUDA device (a
  ``"cuda"`` string, a ``torch.device``, or the integer ``torch.cuda.current_device()`` returns) allocate on the CPU;
  ``torch.cuda``'s device queries, streams, events, memory statistics and RNG state answer as for one device whose
  RNG is the CPU's. ``torch.cuda.is_available()`` and ``device_count()`` keep saying there is none.
* **engine level** (:data:`SITES`, each checked by the sha256 of its source before it is patched):
  Bridge's ``initialize_megatron`` is called with its own ``allow_no_cuda=True``; the dataset index helpers are not
  compiled (the mcore wheel ships them built, without their Makefile, so ``compile_helpers`` exits the process;
  the room's dataset does not use them anyway); ``_set_random_seed`` seeds the model-parallel RNG tracker although
  ``device_count()`` is 0; the distributed optimizer's ``state_dict`` gives step 0 for an empty optimizer state
  (mcore 0.16.1 asserts on it without Apex/TE, which a resume with the distributed optimizer hits before step 1:
  a TE-less GPU run would too) and its ``load_state_dict`` restores the Adam step into the param groups but not
  into the per-parameter state torch's Adam reads (a resumed run's bias correction restarts from 0); MoE's
  ``maybe_move_tensor_to_cpu`` keeps the split sizes on the host (it converts them only ``if tensor.is_cuda``, and
  gloo's all-to-all wants a list), and its router finds ``te_general_gemm`` defined (None: its torch fallback).
* **torch.compile runs eagerly** (:func:`_eager_compile`): Megatron-core's ``jit_fuser`` is ``torch.compile``, and
  on the CPU inductor compiles each fused function's C++ with the host's g++, in every rank of every attempt (20 s of
  a 4-rank launch's 55 s to its first step here, for the same losses to the last digit); those fusions are among what
  a CPU run leaves unproven anyway.
* **Transformer Engine at import** (:func:`_import_bridge`): ``megatron.bridge.peft.lora`` and ``lora_layers`` import
  ``transformer_engine.pytorch`` unconditionally and subclass ``te.Linear``. An inert stand-in is importable only
  while ``megatron.bridge`` imports; afterwards it is gone, the ``HAVE_TE`` flags the Bridge modules set while it
  was there are reset, and a module other than those two still holding it is an error. With
  ``transformer_impl: local`` nothing calls into it (LoRA wraps ``torch.nn.Linear``-based layers there).

It is pinned: :func:`install` refuses other versions of megatron-bridge, megatron-core and torch, and refuses a
patched site whose source hash differs from the one recorded here, naming the site (:class:`OutOfDate`). An engine
upgrade therefore fails the dry run loudly at start-up instead of training on a half-redirected engine; record the
new hashes with ``<engine venv>/bin/python .../megatroncpu.py --hashes`` (the file by path: recipekit is not in that
venv) after reading what changed.

How it is injected, and why it cannot act in a real pod: the module is no part of the runtime package, so no bundle
and no image carries it. The dry run names this file in the pods' environment (:data:`REDIRECT_ENV`); the room's
entry (``runtime.megatron.train``) loads it only when the recipe targets the CPU (``hw.torch_device: cpu``, a recipe
only the dry run builds for the engine) and refuses it, exit 2, for any other target. Standard library only at import
(it is loaded by path, in the engine's own venv).

What a CPU run with it does not prove: kernels (Transformer Engine's and MindSpeed's fused attention, norms, rotary,
SwiGLU, grouped GEMM; the dry run trains with ``transformer_impl: local`` and fusions off), NCCL and HCCL (gloo
here), tensor parallelism together with expert parallelism (it needs sequence parallelism, whose norms need TE or
Apex), the HF export of MoE experts (Bridge 0.3.1 maps them by TE's grouped-GEMM names only), FP8 and bf16
numerics, overlap of communication with compute, memory per device, and speed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import inspect
import sys
import types
from dataclasses import dataclass
from importlib import metadata
from typing import Any

#: The environment variable naming this file for the room's entry (set by the dry run only).
REDIRECT_ENV = "RECIPEKIT_DRYRUN_CPU_REDIRECT"
#: The versions this module was written against and checked with: anything else is refused.
PINNED = {"megatron-bridge": "0.3.1", "megatron-core": "0.16.1", "torch": "2.13.0"}


class OutOfDate(RuntimeError):
    """The engine installed is not the one this redirect was written for (a version, or a patched site's source)."""


@dataclass(frozen=True)
class Site:
    """One engine function this module replaces or wraps, and the sha256 of its source as pinned."""

    module: str
    name: str  # attribute path inside the module: "func" or "Class.method"
    sha256: str
    why: str

    def resolve(self) -> Any:
        target: Any = importlib.import_module(self.module)
        for part in self.name.split("."):
            target = getattr(target, part)
        return target

    def digest(self) -> str:
        return source_digest(self.resolve())


def source_digest(function: Any) -> str:
    """sha256 of a function's source text (what an upgrade that moves a patched site changes)."""
    return hashlib.sha256(inspect.getsource(inspect.unwrap(function)).encode("utf-8")).hexdigest()


SITES: tuple[Site, ...] = (
    Site(
        "megatron.bridge.training.initialize",
        "initialize_megatron",
        "7b56e2e0b267b2d79bea846a84c97c240e5ab4fd093affa2e33057f2add1ec69",
        "asserts torch.cuda.is_available() unless allow_no_cuda (setup() does not pass it), and runs "
        "compile_helpers() (make on a Makefile the mcore wheel lacks, then sys.exit) on local rank 0",
    ),
    Site(
        "megatron.bridge.training.initialize",
        "_set_random_seed",
        "cbc00d852c09bf25fa3f59448d3204598007cc19885d59ba4d5d9289fa10cac2",
        "seeds the model-parallel RNG tracker only if torch.cuda.device_count() > 0",
    ),
    Site(
        "megatron.core.tensor_parallel.random",
        "_get_cuda_rng_state",
        "aa26caaa069c5c4feff0f9f4e69f0f2ab6d6fc7940f71c3a6d0fe9303447d3dc",
        "reads the CUDA generator's state (the tracker's states become the CPU generator's)",
    ),
    Site(
        "megatron.core.tensor_parallel.random",
        "_set_cuda_rng_state",
        "b179c9d95438b61c1d9b58e8e13cc6534f2ae2f870d991c42438de53829ed398",
        "sets the CUDA generator's state through torch._C (the CPU generator's here)",
    ),
    Site(
        "megatron.core.optimizer.distrib_optimizer",
        "DistributedOptimizer.state_dict",
        "fe621ae6a622b58752df0330a2a30056dda222d73f22dc6bce6a5d1ac2bfa3d8",
        "asserts one step in the optimizer state without Apex/TE; empty before step 1, which a resume loads into",
    ),
    Site(
        "megatron.core.optimizer.distrib_optimizer",
        "DistributedOptimizer.load_state_dict",
        "15f257b4c4f9a7ef6d6660e829de088d39997615c2a4e52ec5e7e1306b465f04",
        "restores the Adam step into the param groups but not into each parameter's state without Apex/TE "
        "(torch's Adam reads the latter: a resumed run's bias correction restarts and it leaves its trajectory)",
    ),
    Site(
        "megatron.core.transformer.moe.moe_utils",
        "maybe_move_tensor_to_cpu",
        "8fc5847a887d73195b064efc01599f8768a48bbe3327b8fa50f34112cbbf1153",
        "makes the split sizes numpy only if tensor.is_cuda; gloo's all_to_all_single needs them as a list",
    ),
    Site(
        "megatron.core.transformer.moe.moe_utils",
        "RouterGatingLinearFunction.forward",
        "dcba4f9f02b30a3662d27126739a667cbaf345a82443d1a0cff5792491b95580",
        "reads te_general_gemm, a name moe_utils defines only when Transformer Engine imports (NameError without)",
    ),
)


def check_versions(versions: dict[str, str] | None = None) -> None:
    """The installed engine and torch are the pinned ones (:class:`OutOfDate` naming the first that is not)."""
    found = versions if versions is not None else {name: _installed(name) for name in PINNED}
    for name, pinned in PINNED.items():
        have = found.get(name, "not installed").split("+")[0]
        if have != pinned:
            raise OutOfDate(
                f"the dry run's CPU redirect is pinned to {name} {pinned}, this venv has {have}: "
                "re-check every patched site (recipekit/validate/dryrun/workdir/megatroncpu.py) against the new "
                "version before pinning it"
            )


def check_sites(sites: tuple[Site, ...] = SITES) -> None:
    """Every patched site still has the source it was written against (:class:`OutOfDate` naming the first that
    does not, or that no longer exists)."""
    for site in sites:
        try:
            digest = site.digest()
        except (ImportError, AttributeError, OSError, TypeError) as exc:
            raise OutOfDate(f"CPU redirect site {site.module}.{site.name} is gone ({exc}); it {site.why}") from None
        if digest != site.sha256:
            raise OutOfDate(
                f"CPU redirect site {site.module}.{site.name} changed (sha256 {digest[:12]}…, pinned "
                f"{site.sha256[:12] or 'none'}…): it {site.why}; read the new source and re-pin the site"
            )


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


# ------------------------------------------------------------------------------------------------------ torch
def _is_cuda(device: Any) -> bool:
    """Whether ``device`` names a CUDA device: "cuda", "cuda:N", torch.device("cuda"), or a bare index (what
    torch.cuda.current_device() gives, which factories read as cuda:N)."""
    import torch

    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


def _on_cpu(function: Any) -> Any:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return function(*args, **kwargs)

    return wrapper


#: torch's factories that take ``device=``.
FACTORIES = (
    "tensor",
    "as_tensor",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "rand",
    "randn",
    "randint",
    "randperm",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "rand_like",
    "randn_like",
    "empty_strided",
    "linspace",
    "eye",
)
TENSOR_FACTORIES = ("new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "new_empty_strided")


class _Stream:
    """A CUDA stream or event that does nothing: the CPU runs everything in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None

    def record_event(self, event: Any = None) -> _Stream:
        return _Stream()

    def elapsed_time(self, other: Any) -> float:
        return 0.0

    def query(self) -> bool:
        return True


def _redirect_torch() -> None:
    import torch

    for name in FACTORIES:
        setattr(torch, name, _on_cpu(getattr(torch, name)))
    for name in TENSOR_FACTORIES:
        setattr(torch.Tensor, name, _on_cpu(getattr(torch.Tensor, name)))
    original_to = torch.Tensor.to

    @functools.wraps(original_to)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args and _is_cuda(args[0]):
            args = ("cpu", *args[1:])
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        return original_to(self, *args, **kwargs)

    torch.Tensor.to = to  # type: ignore[method-assign]
    original_type = torch.Tensor.type

    @functools.wraps(original_type)
    def tensor_type(self: Any, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        """Megatron's optimizers sort parameters by ``param.type() == "torch.cuda.FloatTensor"``: a CPU tensor
        names its CUDA twin, and a conversion to a CUDA type converts to the CPU one."""
        if dtype is None:
            name = original_type(self)
            return name.replace("torch.", "torch.cuda.", 1) if not self.is_cuda and "cuda" not in name else name
        if isinstance(dtype, str):
            dtype = dtype.replace("torch.cuda.", "torch.", 1)
        return original_type(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = tensor_type  # type: ignore[method-assign]
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    cuda = torch.cuda
    cuda.current_device = lambda: 0
    cuda.set_device = lambda device: None
    cuda.synchronize = lambda device=None: None
    cuda.Stream = _Stream
    cuda.Event = _Stream
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.current_stream = lambda device=None: _Stream()
    cuda.default_stream = lambda device=None: _Stream()
    cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    # the CPU generator itself (torch.manual_seed calls cuda.manual_seed_all: no detour through it)
    cuda.manual_seed = cuda.manual_seed_all = lambda seed: torch.default_generator.manual_seed(int(seed))
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(cuda, name, lambda device=None: 0)
    cuda.reset_peak_memory_stats = lambda device=None: None
    cuda.reset_max_memory_allocated = lambda device=None: None
    cuda.empty_cache = lambda: None
    cuda.mem_get_info = lambda device=None: (0, 0)
    cuda.memory_stats = lambda device=None: {}


# ----------------------------------------------------------------------------------------- Transformer Engine
#: The Bridge modules that import Transformer Engine unconditionally: the only ones that may keep the stand-in.
TE_IMPORTERS = ("megatron.bridge.peft.lora", "megatron.bridge.peft.lora_layers")
TE_NAMES = ("transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.ops")


class _Inert:
    """A Transformer Engine class the LoRA modules name (``te.Linear``, ``te.ops.Sequential``...): subclassable,
    never an instance of anything the local layer spec builds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("Transformer Engine is not installed (the dry run's stand-in cannot be used)")


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ("pytorch", "ops"):
            return importlib.import_module(f"{self.__name__}.{name}")
        kind = type(name, (_Inert,), {"__module__": self.__name__})
        setattr(self, name, kind)
        return kind


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in TE_NAMES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname != TE_NAMES[-1])
        return None

    def create_module(self, spec: Any) -> Any:
        module = _StandIn(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: Any) -> None:
        return None


def _import_bridge() -> None:
    """``import megatron.bridge`` with the Transformer Engine stand-in importable for that import only, after mcore
    has been imported without it (its own TE probes stay False)."""
    import megatron.core.extensions.transformer_engine  # noqa: F401  (probes TE: absent)
    import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401

    if any(name in sys.modules for name in TE_NAMES):
        raise OutOfDate("transformer_engine is importable here: the CPU redirect is for a venv without it")
    finder = _StandInFinder()
    sys.meta_path.insert(0, finder)
    try:
        import megatron.bridge  # noqa: F401
        import megatron.bridge.peft.lora  # noqa: F401
    finally:
        sys.meta_path.remove(finder)
        stand_ins = [sys.modules.pop(name) for name in TE_NAMES if name in sys.modules]
    for name, module in list(sys.modules.items()):
        if not name.startswith("megatron.") or module is None:
            continue
        if getattr(module, "HAVE_TE", None) is True:  # a probe (try: import transformer_engine) saw the stand-in
            module.HAVE_TE = False
        holds = [key for key, value in vars(module).items() if any(value is s for s in stand_ins)]
        if name in TE_IMPORTERS or not holds:
            continue
        if hasattr(module, "HAVE_TE") or holds == ["transformer_engine"]:  # a probe's leftovers, used only with TE
            for key in holds:
                delattr(module, key)
        else:
            raise OutOfDate(f"{name} kept the Transformer Engine stand-in as {holds}: not a pinned TE importer")


# ---------------------------------------------------------------------------------------------------- engine
def _patch_engine() -> None:
    import torch
    from megatron.bridge.training import initialize, setup
    from megatron.core.optimizer import distrib_optimizer
    from megatron.core.tensor_parallel import random as mp_random
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    setup.initialize_megatron = functools.partial(initialize.initialize_megatron, allow_no_cuda=True)
    initialize.compile_helpers = lambda: None

    seed = initialize._set_random_seed

    @functools.wraps(seed)
    def set_random_seed(*args: Any, **kwargs: Any) -> None:
        count = torch.cuda.device_count
        torch.cuda.device_count = lambda: 1  # seed the tracker: its states are the CPU generator's here
        try:
            seed(*args, **kwargs)
        finally:
            torch.cuda.device_count = count

    initialize._set_random_seed = set_random_seed
    mp_random._get_cuda_rng_state = lambda device=None, clone=False, graph_safe=False: torch.get_rng_state()
    mp_random._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)

    state_dict = distrib_optimizer.DistributedOptimizer.state_dict

    @functools.wraps(state_dict)
    def optimizer_state_dict(self: Any) -> Any:
        inner = self.optimizer.state_dict()
        if distrib_optimizer.HAVE_APEX_OR_TE or inner["state"]:
            return state_dict(self)
        state = {"optimizer": {k: v for k, v in inner.items() if k != "state"}}
        for group in state["optimizer"]["param_groups"]:
            del group["params"]
            group["step"] = 0  # no step taken yet: what the assert would have found after one
        if self.grad_scaler:
            state["grad_scaler"] = self.grad_scaler.state_dict()
        return state

    distrib_optimizer.DistributedOptimizer.state_dict = optimizer_state_dict
    load_state_dict = distrib_optimizer.DistributedOptimizer.load_state_dict

    @functools.wraps(load_state_dict)
    def optimizer_load_state_dict(self: Any, state_dict: Any) -> None:
        load_state_dict(self, state_dict)
        if distrib_optimizer.HAVE_APEX_OR_TE:
            return
        for group in self.optimizer.param_groups:  # torch's Adam: the checkpoint's step, one tensor per parameter
            if group.get("step") is None:
                continue
            for param in group["params"]:
                state = self.optimizer.state.get(param)
                if state:
                    state["step"] = torch.tensor(float(group["step"]), dtype=torch.float32)

    distrib_optimizer.DistributedOptimizer.load_state_dict = optimizer_load_state_dict

    def to_host(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor

    moe_utils.maybe_move_tensor_to_cpu = token_dispatcher.maybe_move_tensor_to_cpu = to_host
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None  # the router's GEMM then falls back to torch.mm, as it was written to


def _eager_compile() -> None:
    """Every ``torch.compile``'d function runs as written (dynamo's own switch, read at each call)."""
    import torch._dynamo

    torch._dynamo.config.disable = True


_installed_once: list[bool] = []


def install() -> list[str]:
    """Check the pins, then redirect (once per process); returns what was done, for the run's log."""
    if _installed_once:
        return []
    check_versions()
    _redirect_torch()
    _eager_compile()
    _import_bridge()
    check_sites()
    _patch_engine()
    _installed_once.append(True)
    return [f"{site.module}.{site.name}: {site.why}" for site in SITES]


def _print_hashes() -> None:
    check_versions()
    _redirect_torch()
    _import_bridge()
    for site in SITES:
        print(f"{site.module}.{site.name} {site.digest()}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--hashes"]:
        _print_hashes()
    else:
        print("usage: <engine venv>/bin/python megatroncpu.py --hashes", file=sys.stderr)
        sys.exit(2)
