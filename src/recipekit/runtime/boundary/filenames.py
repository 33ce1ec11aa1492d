"""The names of the files both sides read: the bundle's, and those a run leaves in its output directory.

recipekit writes the bundle and reads a run's output (report, dry run, validate); train.py and the launcher read the
bundle and write the output. Neither side spells one of these names: both import them from here (standard library
only, shipped in every bundle).
"""

from __future__ import annotations

#: The bundle's files that the launcher and train.py read.
RECIPE_FILE = "recipe.yaml"
LAUNCH_FILE = "launch.json"
DS_CONFIG_FILE = "ds_config.json"
#: The package beside train.py that holds the runtime modules (this one among them).
RUNTIME_PACKAGE = "runtime"
#: This module inside the runtime package: every bundle must carry it (train.py and the launcher find every other
#: file by its names).
FILENAMES_MODULE = "boundary/filenames.py"
#: Where the runtime package lives inside the image and the pods (the Dockerfile's WORKDIR, the Job's workingDir).
POD_WORKDIR = "/workspace"
#: The run's own files (recipe.yaml, launch.json, ds_config.json, run.sh) travel beside the image, in a ConfigMap
#: mounted read-only at ``<POD_WORKDIR>/<RUN_FILES_DIR>``; the runtime package is found in the directory above it.
RUN_FILES_DIR = "run"
#: The script that starts a bundle by hand (one of the run files; a pod runs :data:`POD_COMMAND` instead).
RUN_SCRIPT = "run.sh"
#: The launcher, the first of a run to execute in a pod (runtime/launch.py).
LAUNCH_MODULE = f"{RUNTIME_PACKAGE}.launch"
#: The trainer container's command (the Job's, and the image's CMD): the image's own launcher, run from the image's
#: working directory, on the mounted launch.json. It checks every run file against the digest the Job carries before
#: any of them is read or run; run.sh is for a bundle started by hand and is never what a pod runs.
POD_COMMAND = ("python3", "-m", LAUNCH_MODULE, f"{POD_WORKDIR}/{RUN_FILES_DIR}/{LAUNCH_FILE}")
#: The argument after :data:`POD_COMMAND` of an elastic Job's rendezvous pod: the launcher checks the run files and
#: serves torchrun's rendezvous store (runtime/rendezvous.py), training nothing.
SERVE_RENDEZVOUS = "--serve-rendezvous"
#: The bundle's file holding that ConfigMap (it sorts before volcano-job.yaml: kubectl applies it first).
RUN_FILES_CONFIGMAP = "run-files.yaml"

#: What train.py writes into the run's output directory.
METRICS_FILE = "metrics.jsonl"
RANDOM_INIT_DIR = "random-init"
CHECKPOINT_PREFIX = "checkpoint-"
#: The Trainer writes this last into a checkpoint; its absence marks an interrupted save.
TRAINER_STATE_FILE = "trainer_state.json"
#: Which run wrote a checkpoint (or the final output): run_id and world layout, see :func:`resumechoice.run_record`.
RUN_FILE = "recipekit-run.json"
#: A streaming run's place in its input (runtime/data/stream.py): each chunk's row count, so a resume skips whole
#: chunks.
STREAM_STATE_FILE = "recipekit-stream.json"
#: The benchmark scores of the evaluation after training (``eval.enabled``; runtime/volume/evalrecord.py).
EVAL_FILE = "recipekit-eval.json"
#: transformers marks a checkpoint whose save did not finish with this file.
INCOMPLETE_MARKER = "checkpoint-is-incomplete.txt"
#: The operations layer's outputs (runtime/ops/preflight.py, watchdog.py, health.py, profiling.py, faults.py).
CLUSTER_CHECK_FILE = "cluster-check.json"  # preflight's report
PREFLIGHT_CHECKS = (
    "devices",
    "versions",
    "storage",
    "throughput",
    "allreduce",
    "p2p",
    "burnin",
)  # what every report lists, in order
PREFLIGHT_DIR = "preflight"  # each pod's storage marker, removed once every pod has read the others'
HANG_DIR = "hang"  # the stack dumps of a stalled run: stall-step-<N>-rank-<R>.txt
NONFINITE_PREFIX = "nonfinite-step-"  # nonfinite-step-<N>/: the report and batches of a NaN/inf loss
LOSS_SPIKE_PREFIX = "loss-spike-step-"  # loss-spike-step-<N>/: each rank's loss and batch fingerprints at a spike
PROFILE_DIR = "profile"  # profile/steps-<a>-<b>/: the profiler's traces
FAULTS_DIR = "faults"  # markers of injected faults (ops.testing), so a restarted job is not broken again
#: Model weights as the Trainer, PEFT and DeepSpeed save them: single files and sharded indexes.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_model.safetensors",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.bin",
)
