"""The dry run's CPU redirect for Megatron (validate/dryrun/workdir/megatroncpu.py) is pinned: other engine versions
are refused, and a patched site whose source no longer hashes as recorded (or that is gone) is refused naming it.
The slow test checks the recorded hashes against the engine venv the dry run really uses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from recipekit.validate.dryrun.workdir import megatroncpu
from recipekit.validate.dryrun.workdir.megatroncpu import OutOfDate, Site, check_sites, check_versions, source_digest


def patched_here() -> int:
    return 1


def test_the_pinned_versions_pass_and_any_other_is_named() -> None:
    check_versions(dict(megatroncpu.PINNED))
    check_versions({**megatroncpu.PINNED, "torch": "2.13.0+cpu"})  # a local build tag is the same release
    with pytest.raises(OutOfDate, match="pinned to megatron-bridge 0.3.1, this venv has 0.6.2"):
        check_versions({**megatroncpu.PINNED, "megatron-bridge": "0.6.2"})
    with pytest.raises(OutOfDate, match="pinned to megatron-core 0.16.1, this venv has not installed"):
        check_versions({"megatron-bridge": "0.3.1", "torch": "2.13.0"})


def test_a_site_whose_source_moved_is_named() -> None:
    here = Site(__name__, "patched_here", source_digest(patched_here), "is this test's")
    check_sites((here,))
    moved = Site(__name__, "patched_here", "0" * 64, "is this test's")
    with pytest.raises(OutOfDate, match=rf"site {__name__}.patched_here changed .*it is this test's"):
        check_sites((moved,))
    gone = Site(__name__, "renamed_upstream", "0" * 64, "was renamed")
    with pytest.raises(OutOfDate, match=rf"site {__name__}.renamed_upstream is gone"):
        check_sites((gone,))


def test_every_site_is_pinned_by_a_full_digest() -> None:
    assert megatroncpu.SITES
    for site in megatroncpu.SITES:
        assert len(site.sha256) == 64 and set(site.sha256) <= set("0123456789abcdef"), site
        assert site.module.startswith(("megatron.bridge.", "megatron.core.")) and site.why


def test_the_module_imports_only_the_standard_library_at_load() -> None:
    """It is loaded by path into the engine's venv, where recipekit is not installed."""
    source = open(megatroncpu.__file__, encoding="utf-8").read()
    top_level = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert all(line.split()[1].split(".")[0] in {"__future__", "contextlib", "functools", "hashlib", "importlib",
                                                  "inspect", "sys", "types", "dataclasses", "typing"}
               for line in top_level), top_level  # fmt: skip


@pytest.mark.slow
def test_the_recorded_hashes_are_those_of_the_pinned_engine() -> None:
    """In the engine venv the dry run builds (images/engines/megatron-bridge.txt): every site hashes as recorded."""
    from recipekit.validate.dryrun.workdir.enginevenv import engine_python

    done = subprocess.run(
        [str(engine_python()), megatroncpu.__file__, "--hashes"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = dict(line.rsplit(" ", 1) for line in done.stdout.splitlines() if line.startswith("megatron."))
    assert found == {f"{site.module}.{site.name}": site.sha256 for site in megatroncpu.SITES}


def test_torch_compiled_functions_run_as_written_once_redirected() -> None:
    """Megatron-core's ``jit_fuser`` is ``torch.compile``: on the CPU inductor would compile each fused function with
    g++ in every rank of every attempt. After the redirect's switch dynamo captures no frame, and the result is the
    function's own (in a child process: the switch is process-wide)."""
    pytest.importorskip("torch")
    code = (
        "import importlib.util, sys, torch\n"
        "from torch._dynamo.utils import counters\n"
        f"spec = importlib.util.spec_from_file_location('megatroncpu', {megatroncpu.__file__!r})\n"
        "module = sys.modules['megatroncpu'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "fused = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2)\n"
        "module._eager_compile()\n"
        "x = torch.linspace(-1, 1, 8)\n"
        "assert torch.equal(fused(x), torch.nn.functional.gelu(x) * 2)\n"
        "print(sum(counters['frames'].values()))\n"
    )
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0"
