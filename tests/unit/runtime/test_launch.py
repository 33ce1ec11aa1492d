"""The pod side of a bundle: runtime/launch.py under a simulated Volcano pod, with a fake torchrun.

Each test starts the bundle either as its pods do (the Job's container command, the image's launcher, on the run
files mounted as the ConfigMap is) or by hand (its run.sh), in a clean environment holding only what Volcano's env
and svc plugins inject, with a ``torchrun`` first on PATH that prints the argv and environment it was given as JSON
and exits: what would have launched training is checked byte for byte, and nothing trains.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from recipekit.base.paths import RECIPES_DIR
from recipekit.bundle.build import build, resolve
from recipekit.runtime import launch

FAKE_TORCHRUN = """#!{python}
import json, os, sys
print(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ)}}))
"""


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("bin")
    torchrun = directory / "torchrun"
    torchrun.write_text(FAKE_TORCHRUN.format(python=sys.executable))
    torchrun.chmod(0o755)
    (directory / "python3").symlink_to(sys.executable)
    return directory


def pod_env(fake_bin: Path, index: int, hosts: list[str], task: str = "WORKER", **extra: str) -> dict[str, str]:
    """What a pod's container starts with: Volcano's variables, a PATH, nothing of this test process."""
    return {
        "PATH": f"{fake_bin}:/usr/bin:/bin",
        "HOME": "/tmp",
        "VC_TASK_INDEX": str(index),
        "VK_TASK_INDEX": str(index),
        f"VC_{task}_HOSTS": ",".join(hosts),
        f"VC_{task}_NUM": str(len(hosts)),
        **extra,
    }


def run_pod(bundle: Path, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(bundle / "run.sh")], env=env, capture_output=True, text=True, timeout=timeout)


def set_launch(bundle: Path, **changes: object) -> None:
    path = bundle / "launch.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


PAYLOADS = ["$(touch pwned)", "`touch pwned`", "a; touch pwned", "x}y", "'\"\\", "a\tb", "${HOME}", "$((1+1))"]


def test_every_env_value_reaches_torchrun_byte_for_byte_and_nothing_runs(tmp_path: Path, fake_bin: Path) -> None:
    """A team's hardware option with shell payloads in its env: the values are data in launch.json, never shell."""
    env_values = {f"PAYLOAD_{i}": value for i, value in enumerate(PAYLOADS)}
    team = tmp_path / "team" / "hw"
    team.mkdir(parents=True)
    cpu = yaml.safe_load((RECIPES_DIR / "hw" / "cpu.yaml").read_text())
    # OmegaConf reads ${...} as an interpolation; a literal one is written \${...} in a recipe
    escaped = {k: v.replace("${", "\\${") for k, v in env_values.items()}
    (team / "payload.yaml").write_text(yaml.safe_dump({**cpu, "name": "payload", "env": escaped}))
    bundle = build(["recipe=tiny_sft", "hw=payload", "cluster.nodes=2"], tmp_path / "bundle", extra_dirs=[team.parent])
    proc = run_pod(bundle.path, pod_env(fake_bin, 1, ["127.0.0.1", "127.0.0.1"]), timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    for key, value in env_values.items():
        assert seen["env"][key] == value, key
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()
    argv = seen["argv"]
    assert "--nnodes=2" in argv and "--node_rank=1" in argv and "--master_addr=127.0.0.1" in argv
    assert argv[argv.index("-m") + 1] == "runtime.train"
    checked = Path(argv[argv.index("--recipe") + 1])  # the launcher's own copy of the files it read
    assert checked.name == "recipe.yaml" and bundle.path not in checked.parents and not checked.exists()
    # the launcher's defaults never override what the pod spec set
    proc = run_pod(bundle.path, pod_env(fake_bin, 0, ["127.0.0.1", "127.0.0.1"], PAYLOAD_0="from the pod spec"))
    assert json.loads(proc.stdout.strip().splitlines()[-1])["env"]["PAYLOAD_0"] == "from the pod spec"


def test_missing_volcano_variables_name_the_plugin(tmp_path: Path, fake_bin: Path) -> None:
    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle").path
    env = pod_env(fake_bin, 0, ["127.0.0.1"])
    del env["VC_TASK_INDEX"], env["VK_TASK_INDEX"]
    proc = run_pod(bundle, env)
    assert proc.returncode == 2 and "env plugin" in proc.stderr and "Traceback" not in proc.stderr
    env = pod_env(fake_bin, 0, ["127.0.0.1"])
    del env["VC_WORKER_HOSTS"]
    proc = run_pod(bundle, env)
    assert proc.returncode == 2 and "svc plugin" in proc.stderr


def test_a_pod_count_the_bundle_was_not_built_for_is_refused(tmp_path: Path, fake_bin: Path) -> None:
    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle").path
    proc = run_pod(bundle, pod_env(fake_bin, 0, ["127.0.0.1"] * 3))
    assert proc.returncode == 2 and "rebuild with cluster.nodes=3" in proc.stderr


def test_a_master_that_never_resolves_fails_the_pod_with_its_reason(tmp_path: Path, fake_bin: Path) -> None:
    bundle = build(["recipe=tiny_sft", "cluster.nodes=2"], tmp_path / "bundle").path
    set_launch(bundle, master_dns_wait_s=1)
    hosts = ["nowhere-0.invalid", "nowhere-1.invalid"]
    proc = run_pod(bundle, pod_env(fake_bin, 1, hosts), timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "the master nowhere-0.invalid did not resolve within 1 s" in proc.stderr
    assert proc.stdout == ""  # torchrun never started


def test_an_npu_image_without_cann_fails_with_its_reason(tmp_path: Path, fake_bin: Path) -> None:
    bundle = build(["recipe=llama3_8b_sft", "hw=ascend910b"], tmp_path / "bundle").path
    proc = run_pod(bundle, pod_env(fake_bin, 0, ["127.0.0.1"]))
    assert proc.returncode == 2
    assert "no CANN environment script found" in proc.stderr and proc.stdout == ""


def test_a_cann_script_that_fails_is_reported_not_fatal_in_silence(tmp_path: Path, fake_bin: Path) -> None:
    """set_env.sh returning non-zero must not end the launch without a word, nor be ignored."""
    bundle = build(["recipe=llama3_8b_sft", "hw=ascend910b"], tmp_path / "bundle").path
    broken = tmp_path / "set_env.sh"
    broken.write_text("echo sourcing\nfalse\n")
    set_launch(bundle, cann_env=[str(broken)])
    proc = run_pod(bundle, pod_env(fake_bin, 0, ["127.0.0.1"]))
    assert proc.returncode == 2 and f"{broken} failed with exit 1" in proc.stderr
    assert proc.stdout == "" and "sourcing" in proc.stderr  # the script's own output goes to the log, not to torchrun


def test_cann_is_sourced_by_the_launcher_for_torchrun(tmp_path: Path, fake_bin: Path) -> None:
    """The image's launcher sources CANN's set_env.sh (launch.json cann_env, the image family's): its exports reach
    torchrun, after the scripts that do not exist are passed over, and the runtime package stays first on
    PYTHONPATH."""
    bundle = build(["recipe=llama3_8b_sft", "hw=ascend910b"], tmp_path / "bundle").path
    assert json.loads((bundle / "launch.json").read_text())["cann_env"][0].endswith("/set_env.sh")
    good = tmp_path / "set_env.sh"
    good.write_text(
        "export ASCEND_TOOLKIT_HOME=/opt/cann\nexport PYTHONPATH=/opt/cann/python${PYTHONPATH:+:$PYTHONPATH}\n"
    )
    set_launch(bundle, cann_env=[str(tmp_path / "absent.sh"), str(good)])
    proc = run_pod(bundle, pod_env(fake_bin, 0, ["127.0.0.1"]))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["env"]["ASCEND_TOOLKIT_HOME"] == "/opt/cann"
    assert seen["env"]["PYTHONPATH"].split(":")[:2] == [str(bundle), "/opt/cann/python"]
    assert seen["env"]["DS_ACCELERATOR"] == "npu" and "--nproc_per_node=8" in seen["argv"]


def test_the_svc_plugins_host_file_stands_in_for_the_variable(tmp_path: Path) -> None:
    (tmp_path / "worker.host").write_text("pod-0.job\npod-1.job\n")
    spec = {"task_name": "worker", "task_env": "WORKER", "nodes": 2}
    topo = launch.topology(spec, {"VC_TASK_INDEX": "1"}, hosts_dir=tmp_path)
    assert (topo.node_rank, topo.nodes, topo.master) == (1, 2, "pod-0.job")


def test_waiting_for_the_master_gives_up_at_the_deadline() -> None:
    clock = iter(range(0, 1000, 2))
    with pytest.raises(launch.LaunchError) as info:
        launch.wait_for_master(
            "x",
            5,
            resolve=lambda host: (_ for _ in ()).throw(OSError("no")),
            sleep=lambda s: None,
            clock=lambda: next(clock),
        )
    assert info.value.code == 1 and "did not resolve within 5 s" in str(info.value)


# ------------------------------------------------------------------------------------------------ run identity
def names(*overrides: str) -> tuple[str, str]:
    plan = resolve(["recipe=llama3_8b_sft", *overrides]).plan
    return plan.job_name, plan.output_dir


def test_a_run_keeps_its_name_across_rebuilds_and_placement_changes() -> None:
    same = names()
    assert names() == same
    assert names("cluster.queue=other", "cluster.namespace=team-b") == same  # placement is not identity
    assert names("train.save_steps=50", "train.logging_steps=1") == same  # bookkeeping is not identity
    assert same[0].startswith("llama3-8b-sft-") and same[1].endswith("/" + same[0])


@pytest.mark.parametrize(
    "override",
    [
        "model=qwen2.5_7b",
        "train.global_batch_size=256",
        "parallel=zero2",
        "train.learning_rate=3e-5",
        "data.max_len=1024",
    ],
)
def test_a_run_defining_change_gets_its_own_job_and_directory(override: str) -> None:
    job, output = names()
    other_job, other_output = names(override)
    assert other_job != job and other_output != output


def test_the_same_global_batch_on_other_nodes_is_the_same_run_another_global_batch_is_not() -> None:
    """The identity is keyed on the global batch, not its factors: a run may continue on fewer nodes (rescale)."""
    assert names("cluster.nodes=2") == names()  # global batch 128 kept, accumulation halved
    fixed = ("train.global_batch_size=null", "train.gradient_accumulation_steps=4")
    assert names(*fixed, "cluster.nodes=2") != names(*fixed)  # accumulation kept: the global batch doubles


def test_runs_of_different_presets_never_share_a_directory() -> None:
    assert len({names(f"model={m}")[1] for m in ("llama3_8b", "qwen2.5_7b", "qwen2.5_14b")}) == 3


@pytest.fixture(autouse=True)
def _no_stray_files(tmp_path: Path):
    yield
    shutil.rmtree(tmp_path / "pwned", ignore_errors=True)
    if os.path.exists("pwned"):  # pragma: no cover - would mean a payload ran in the test's cwd
        os.remove("pwned")
        raise AssertionError("a payload ran")


def start_pod(bundle: Path, root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Pod 0 as the Job starts it: the Job's container command, read from the bundle's volcano-job.yaml, from the
    image's working directory (its paths there mapped to the simulated pod's root)."""
    job = yaml.safe_load((bundle / "volcano-job.yaml").read_text())
    container = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    workdir, pod = container["workingDir"], root / "pods" / "pod-0"
    command = [str(pod / w[len(workdir) + 1 :]) if w.startswith(workdir + "/") else w for w in container["command"]]
    return subprocess.run(command, cwd=pod, env=env, capture_output=True, text=True, timeout=60)


def one_line_refusal(proc: subprocess.CompletedProcess[str]) -> str:
    """The pod exited 2 with one line on stderr, nothing on stdout (torchrun never ran), no traceback."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout.strip()
    return lines[0]


def test_a_pod_runs_from_its_mounted_run_files_and_an_edited_recipe_exits_2_in_one_line(
    tmp_path: Path, fake_bin: Path
) -> None:
    """The Job's layout: the runtime in the image's working directory, the ConfigMap's run files mounted read-only
    beside it, the Job's digest of them in the environment. The launcher starts from a checked copy of them; once
    recipe.yaml differs (a ConfigMap edited by hand) the pod exits 2 with one line, before torchrun."""
    from recipekit.validate.dryrun.workdir import podmount

    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle").path
    root = tmp_path / "cluster"
    digest = podmount.mount(bundle, root, 0)
    assert digest and digest.startswith("sha256:")
    mounted = podmount.run_script(root, 0).parent
    env = pod_env(fake_bin, 0, ["127.0.0.1"] * 2, RECIPEKIT_RUN_FILES_DIGEST=digest)
    proc = start_pod(bundle, root, env)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout.strip().splitlines()[-1])["argv"]
    recipe_read = Path(argv[argv.index("--recipe") + 1])
    assert recipe_read.name == "recipe.yaml" and mounted not in recipe_read.parents  # the checked copy, not the mount
    assert not recipe_read.exists(), "the launcher's copy goes with it"
    assert not os.access(mounted / "recipe.yaml", os.W_OK) or os.geteuid() == 0  # mounted read-only

    recipe = mounted / "recipe.yaml"
    mounted.chmod(0o755)
    recipe.chmod(0o644)
    recipe.write_text(recipe.read_text().replace("learning_rate:", "learning_rate: 1.0e-09 #"))
    assert "differ from the digest the Job carries" in one_line_refusal(start_pod(bundle, root, env))
    podmount.unmount(root)


def test_a_configmap_edited_run_sh_never_runs(tmp_path: Path, fake_bin: Path) -> None:
    """Issue 38: the ConfigMap's run.sh gains a command (and the line that would switch the check off). The pod's
    command is the image's launcher, which checks every run file before any of them runs: the command never runs,
    the pod exits 2 with one line. Through the dry run's own pod command too (workdir/podmount.pod_command)."""
    from recipekit.validate.dryrun.workdir import podmount

    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle").path
    root = tmp_path / "cluster"
    digest = podmount.mount(bundle, root, 0)
    assert digest is not None
    marker = tmp_path / "PLANTED"
    script = podmount.run_script(root, 0)
    script.parent.chmod(0o755)
    script.chmod(0o644)
    text = script.read_text()
    script.write_text(
        text.replace("set -euo pipefail\n", f"set -euo pipefail\ntouch {marker}\nunset RECIPEKIT_RUN_FILES_DIGEST\n")
    )
    env = pod_env(fake_bin, 0, ["127.0.0.1"] * 2, RECIPEKIT_RUN_FILES_DIGEST=digest)
    assert "differ from the digest the Job carries" in one_line_refusal(start_pod(bundle, root, env))
    assert not marker.exists()
    command = podmount.pod_command(bundle, root, 0)
    assert command[:3] == ["python3", "-m", "runtime.launch"] and "bash" not in command
    proc = subprocess.run(command, cwd=podmount.pod_root(root, 0), env=env, capture_output=True, text=True, timeout=60)
    assert "differ from the digest the Job carries" in one_line_refusal(proc)
    assert not marker.exists()
    podmount.unmount(root)


def test_a_pod_whose_job_carries_no_digest_is_refused(tmp_path: Path, fake_bin: Path) -> None:
    """An absent (or empty) digest is a refusal, not a pass: nothing of the mounted files is trusted unchecked."""
    from recipekit.validate.dryrun.workdir import podmount

    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle").path
    root = tmp_path / "cluster"
    podmount.mount(bundle, root, 0)
    for extra in ({}, {"RECIPEKIT_RUN_FILES_DIGEST": ""}):
        line = one_line_refusal(start_pod(bundle, root, pod_env(fake_bin, 0, ["127.0.0.1"] * 2, **extra)))
        assert "RECIPEKIT_RUN_FILES_DIGEST is not set" in line
    podmount.unmount(root)


def test_the_refusal_never_echoes_control_characters_of_the_digest(tmp_path: Path, fake_bin: Path) -> None:
    from recipekit.validate.dryrun.workdir import podmount

    bundle = build(["recipe=tiny_sft"], tmp_path / "bundle").path
    root = tmp_path / "cluster"
    podmount.mount(bundle, root, 0)
    hostile = "sha256:\x1b]0;owned\x07\x1b[2J\r\x9b31m"
    env = pod_env(fake_bin, 0, ["127.0.0.1"] * 2, RECIPEKIT_RUN_FILES_DIGEST=hostile)
    line = one_line_refusal(start_pod(bundle, root, env))
    assert "differ from the digest" in line and "\\x1b" in line
    assert not any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in line), repr(line)
    podmount.unmount(root)


def test_the_run_files_digest_follows_every_run_file_and_nothing_else() -> None:
    from recipekit.runtime.boundary import runfiles

    files = {"recipe.yaml": b"a", "launch.json": b"b", "run.sh": b"c", "Dockerfile": b"d"}
    base = runfiles.digest(files)
    assert runfiles.digest({**files, "Dockerfile": b"other"}) == base
    assert runfiles.digest({**files, "recipe.yaml": b"A"}) != base
    assert runfiles.digest({**files, "ds_config.json": b"{}"}) != base
    assert runfiles.digest({k: v for k, v in files.items() if k != "run.sh"}) != base


def test_an_elastic_bundle_starts_torchruns_elastic_agent_at_the_rendezvous_pod(tmp_path: Path, fake_bin: Path) -> None:
    """cluster.min_nodes: --nnodes MIN:MAX over the c10d rendezvous at the rendezvous pod's fixed port (the Job's
    rdzv task; every agent a client, is_host false, so no worker pod's loss takes the store along), the last call
    cluster.elastic_wait_s, each agent named by its Volcano host, no node rank (the rendezvous gives them), the
    restart budget, and the workers' own store (the shared one hangs torch 2.13's agents when a node joins). A
    launch.json from before the rendezvous task (none named) keeps the store on pod 0's agent."""
    overrides = [
        "recipe=tiny_sft",
        "parallel=ddp",
        "cluster.nodes=2",
        "cluster.min_nodes=1",
        "cluster.elastic_wait_s=90",
    ]
    bundle = build(overrides, tmp_path / "b")
    port = resolve(["recipe=tiny_sft"]).plan.master_port
    hosts = ["127.0.0.2", "localhost"]  # names that resolve here (the launcher waits for the rendezvous pod's)
    for index in (0, 1):
        proc = run_pod(bundle.path, pod_env(fake_bin, index, hosts, VC_RDZV_HOSTS="127.0.0.1", VC_RDZV_NUM="1"))
        assert proc.returncode == 0, proc.stderr
        argv = json.loads(proc.stdout.strip().splitlines()[-1])["argv"]
        assert "--nnodes=1:2" in argv and "--rdzv-backend=c10d" in argv and "--max-restarts=3" in argv
        assert f"--rdzv-endpoint=127.0.0.1:{port}" in argv
        assert "--rdzv-conf=is_host=false,last_call_timeout=90" in argv
        assert f"--local-addr={hosts[index]}" in argv and not any(a.startswith("--node_rank") for a in argv)
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        assert found["env"]["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    missing = run_pod(bundle.path, pod_env(fake_bin, 0, hosts))
    assert missing.returncode == 2 and "VC_RDZV_HOSTS is not set" in missing.stderr and "'rdzv'" in missing.stderr
    launch_json = json.loads((bundle.path / "launch.json").read_text())
    del launch_json["elastic"]["rendezvous"]
    set_launch(bundle.path, elastic=launch_json["elastic"])
    for index in (0, 1):
        proc = run_pod(bundle.path, pod_env(fake_bin, index, hosts))
        argv = json.loads(proc.stdout.strip().splitlines()[-1])["argv"]
        assert f"--rdzv-endpoint=127.0.0.2:{port}" in argv
        assert f"--rdzv-conf=is_host={'true' if index == 0 else 'false'},last_call_timeout=90" in argv


def test_the_rendezvous_pod_serves_torchs_store_until_sigterm_and_trains_nothing(tmp_path: Path) -> None:
    """The rendezvous task's container (the image's launcher with --serve-rendezvous) checks the run files, then
    serves torch's TCPStore on the Job's port, where a client sets and reads a key; SIGTERM (Volcano reclaiming it)
    ends it. A gang bundle's launch.json names no rendezvous task: the same argument is refused, exit 2."""
    import signal
    import time

    import torch.distributed as dist

    from recipekit.bundle.render import restamp_run_files
    from recipekit.validate.dryrun.workdir import podmount
    from recipekit.validate.shared.ports import free_port

    bundle = build(["recipe=tiny_sft", "parallel=ddp", "cluster.nodes=2", "cluster.min_nodes=1"], tmp_path / "b")
    port = free_port(set())
    set_launch(bundle.path, master_port=port)
    names = ("launch.json", "recipe.yaml", "run.sh", "ds_config.json", "volcano-job.yaml", "run-files.yaml")
    files = {name: (bundle.path / name).read_bytes() for name in names if (bundle.path / name).is_file()}
    for name, data in restamp_run_files(files).items():  # the ConfigMap and the Job's digest follow launch.json
        (bundle.path / name).write_bytes(data)
    root = tmp_path / "cluster"
    command = podmount.pod_command(bundle.path, root, 0, "rdzv")
    assert command[-1] == "--serve-rendezvous"
    digest = podmount.mount(bundle.path, root, 0, "rdzv")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": "/tmp", "VC_TASK_INDEX": "0"}
    env["RECIPEKIT_RUN_FILES_DIGEST"] = str(digest)
    pod = subprocess.Popen(command, cwd=podmount.pod_root(root, 0, "rdzv"), env=env, stderr=subprocess.PIPE, text=True)
    try:
        client = None
        for _ in range(120):
            try:
                client = dist.TCPStore("127.0.0.3", port, is_master=False, timeout=timedelta(seconds=2))
                break
            except (RuntimeError, OSError):
                time.sleep(0.5)
        assert client is not None, "the store never answered"
        client.set("round", "1")
        assert client.get("round") == b"1"
        pod.send_signal(signal.SIGTERM)
        _, err = pod.communicate(timeout=30)
    finally:
        pod.kill()
        podmount.unmount(root)
    assert f"serving torchrun's c10d rendezvous store on port {port}" in err and "Traceback" not in err
    gang = build(["recipe=tiny_sft", "cluster.nodes=2"], tmp_path / "gang").path
    proc = subprocess.run(
        ["bash", "-c", f"cd {gang} && python3 -m runtime.launch launch.json --by-hand --serve-rendezvous"],
        env={"PATH": env["PATH"], "HOME": "/tmp", "PYTHONPATH": str(gang)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "launch.json names no rendezvous task (the run is not elastic)" in proc.stderr


def test_a_configmap_edit_that_makes_a_gang_run_elastic_is_refused_before_torchrun(
    tmp_path: Path, fake_bin: Path
) -> None:
    """An attacker with the ConfigMap adds ``elastic`` to launch.json (the run would go on without pods the Job
    gang-schedules, at a batch nobody planned): the digest the Job carries refuses it in one line, torchrun never
    starts. A bundle run by hand with an ``elastic`` that is no range of its Job is refused too (exit 2)."""
    from recipekit.validate.dryrun.workdir import podmount

    bundle = build(["recipe=tiny_sft", "cluster.nodes=2"], tmp_path / "bundle").path
    root = tmp_path / "cluster"
    digest = podmount.mount(bundle, root, 0)
    assert digest is not None
    launch = podmount.run_script(root, 0).parent / "launch.json"
    launch.parent.chmod(0o755)
    launch.chmod(0o644)
    launch.write_text(
        json.dumps(
            {**json.loads(launch.read_text()), "elastic": {"min_nodes": 1, "max_restarts": 9, "last_call_s": 30}}
        )
    )
    env = pod_env(fake_bin, 0, ["127.0.0.1"] * 2, RECIPEKIT_RUN_FILES_DIGEST=digest)
    assert "differ from the digest the Job carries" in one_line_refusal(start_pod(bundle, root, env))
    podmount.unmount(root)
    for elastic in (
        {"min_nodes": 3, "max_restarts": "3; touch pwned", "last_call_s": 30},
        {"min_nodes": 1, "max_restarts": 3, "last_call_s": "30,is_host=true"},  # no second store host by the conf
        {"min_nodes": 1, "max_restarts": 3},
    ):
        set_launch(bundle, elastic=elastic)
        refusal = one_line_refusal(run_pod(bundle, pod_env(fake_bin, 0, ["127.0.0.1"] * 2)))
        assert "elastic is not a min_nodes, max_restarts and last_call_s of this Job" in refusal, elastic
        assert not Path("pwned").exists()
