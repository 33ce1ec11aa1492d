"""The bundle's file names: which are executable, which travel beside the image (the run files), where they live
in the pod. (The image holds the runtime package only: image/stack.py.)

A leaf module: render writes these names, bundle.py sets their modes, validate reads them back, and the dry run
copies them; none of them spells a file name of its own. The names train.py and the launcher read at run time
come from the runtime contract, which is shipped inside the bundle.
"""

from __future__ import annotations

from pathlib import Path

from recipekit.base.limits import BUNDLE_FILE, read_regular
from recipekit.image.stack import runtime_paths
from recipekit.runtime.boundary import filenames, runfiles

#: Where the runtime lives inside the image and the pods (the Dockerfile's WORKDIR, the Job's workingDir).
WORKDIR = filenames.POD_WORKDIR
#: Where the run files (the ConfigMap) are mounted read-only in every pod.
RUN_FILES_MOUNT = f"{WORKDIR}/{filenames.RUN_FILES_DIR}"

MANIFEST = "manifest.json"
RECIPE = filenames.RECIPE_FILE
LAUNCH = filenames.LAUNCH_FILE
DS_CONFIG = filenames.DS_CONFIG_FILE
RUN = filenames.RUN_SCRIPT
#: The ConfigMap holding the run files (it sorts before the Job's file: ``kubectl apply`` creates it first).
RUN_FILES_CONFIGMAP = filenames.RUN_FILES_CONFIGMAP
#: What travels beside the image, in that ConfigMap: the run's own files.
RUN_FILES = runfiles.RUN_FILE_NAMES
DOCKERFILE = "Dockerfile"
JOB = "volcano-job.yaml"
#: kubectl's own way to apply a directory as one unit (``kubectl apply -k DIR``): it lists the ConfigMap and the Job.
#: ``kubectl apply -f DIR`` would also take manifest.json, launch.json and plan.json, which are not Kubernetes
#: objects, and the monitoring files, which need the Prometheus Operator's CRDs.
KUSTOMIZATION = "kustomization.yaml"
README = "README.md"
PLAN_JSON = "plan.json"
PLAN_MD = "plan.md"
#: The monitoring files (only when the recipe serves metrics, ``ops.metrics_port``): for kubectl and Grafana.
PODMONITOR = "podmonitor.yaml"
PROMETHEUS_RULE = "prometheusrule.yaml"
DASHBOARD = "grafana-dashboard.json"
#: The runtime package: src/recipekit/runtime/**/*.py, copied verbatim under this directory.
RUNTIME = filenames.RUNTIME_PACKAGE
#: The module torchrun starts in each process (``torchrun ... -m runtime.train``).
TRAIN_MODULE = f"{RUNTIME}.train"
#: The launcher module and the trainer container's command: the image's launcher (runtime/boundary/filenames.py).
LAUNCH_MODULE = filenames.LAUNCH_MODULE
POD_COMMAND = filenames.POD_COMMAND

EXECUTABLE = frozenset({RUN})
#: Files every bundle has (ds_config.json only with DeepSpeed; plan.* only when built with an estimate).
REQUIRED = (
    RECIPE,
    LAUNCH,
    RUN,
    RUN_FILES_CONFIGMAP,
    JOB,
    KUSTOMIZATION,
    DOCKERFILE,
    README,
    f"{RUNTIME}/train.py",
    f"{RUNTIME}/{filenames.FILENAMES_MODULE}",
)


def matrix_bundles(root: Path) -> list[Path] | None:
    """The bundles of a matrix root (the output root ``build -m`` writes, bundle/sweep.py: one bundle directory per
    combination) in name order; None when ``root`` is a bundle itself or holds none. Hidden directories (the dry
    runs' ``.dryrun``) and links are passed over."""
    if not root.is_dir() or root.is_symlink() or (root / MANIFEST).exists():
        return None
    found = sorted(
        child
        for child in root.iterdir()
        if not child.name.startswith(".") and not child.is_symlink() and child.is_dir() and (child / MANIFEST).is_file()
    )
    return found or None


def runtime_files(engine: str) -> dict[str, Path]:
    """Bundle path → source file of every runtime module ``engine``'s bundles ship (the whole package with its inner
    packages but other engines' rooms: image/runtimefiles.py), in a stable order: what the image's Dockerfile copies
    (image/stack.py)."""
    return runtime_paths(engine)


def read_files(directory: Path) -> tuple[dict[str, bytes], list[str]]:
    """A bundle directory's files as ``{name: bytes}`` (runtime modules as ``runtime/<file>``), and the entries that
    are no part of a bundle's layout (other directories, links), so callers can report them."""
    files: dict[str, bytes] = {}
    strays: list[str] = []
    for entry in sorted(Path(directory).iterdir()):
        if entry.is_symlink():
            strays.append(entry.name)
        elif entry.is_file():
            files[entry.name] = read_regular(entry, BUNDLE_FILE)
        elif entry.name == RUNTIME and entry.is_dir():
            _read_package(entry, RUNTIME, files, strays)
        else:
            strays.append(entry.name + "/")
    return files, strays


#: How deep the runtime's packages nest in a bundle (runtime/<room>/<inner room>/<module>.py); deeper directories are
#: strays.
RUNTIME_DEPTH = 3


def _read_package(directory: Path, name: str, files: dict[str, bytes], strays: list[str], depth: int = 1) -> None:
    """The runtime package's files into ``files`` as ``runtime/<room>/<file>``; links, and directories deeper than
    the runtime nests, into ``strays`` (``__pycache__`` is Python's own and ignored)."""
    for inner in sorted(directory.iterdir()):
        inner_name = f"{name}/{inner.name}"
        if inner.is_symlink():
            strays.append(inner_name)
        elif inner.is_file():
            files[inner_name] = read_regular(inner, BUNDLE_FILE)
        elif inner.name == "__pycache__":
            continue
        elif inner.is_dir() and depth < RUNTIME_DEPTH:
            _read_package(inner, inner_name, files, strays, depth + 1)
        else:
            strays.append(inner_name + "/" if inner.is_dir() else inner_name)
