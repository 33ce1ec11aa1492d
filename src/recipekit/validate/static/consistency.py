"""Cross-file consistency: the files of a bundle agree with each other and with the hardware they target.

Each check compares values that were rendered from one plan but live in different files — the Job's replicas and
device resources, launch.json, recipe.yaml's plan and Trainer arguments, ds_config.json — so a hand edit (or a bug in
rendering) that makes them disagree is caught before a cluster is. Findings name the file and field to fix.
"""

from __future__ import annotations

from typing import Any

from recipekit.bundle.files import DS_CONFIG as DS
from recipekit.bundle.files import JOB, LAUNCH, RECIPE
from recipekit.plan.plan import resolve_precision
from recipekit.recipe.k8snames import task_env_name
from recipekit.recipe.volumes import off_volumes, under
from recipekit.runtime.boundary import filenames
from recipekit.validate.shared.loader import Bundle, as_int, container_of, device_resources, task_of
from recipekit.validate.shared.results import Result, Status


def check_world_size(bundle: Bundle) -> Result:
    """replicas × devices per pod = world size in the plan = what launch.json starts."""
    result = Result("consistency.world-size", "replicas × devices per pod = plan world size = what the launcher starts")
    located = task_of(bundle.job)
    if located is None or not bundle.plan or bundle.launch is None:
        return result.skip("needs volcano-job.yaml (with a task), recipe.yaml's plan and launch.json")
    index, task = located
    where = f"spec.tasks[{index}]"
    replicas = as_int(task.get("replicas"))
    resources = device_resources(container_of(task))
    hw = bundle.recipe.hw if bundle.recipe else None
    plan = bundle.plan
    if hw is not None and hw.device_resource:
        per_pod = as_int(resources.get(hw.device_resource))
        resource_name = hw.device_resource
    elif resources:
        resource_name, value = next(iter(resources.items()))
        per_pod = as_int(value)
    else:
        resource_name, per_pod = "(CPU: one process per pod)", 1
    world = plan.get("world_size")
    if replicas is not None and per_pod is not None and replicas * per_pod != world:
        result.fail(
            JOB,
            f"{where}.replicas",
            f"replicas × {resource_name} = {replicas} × {per_pod} = {replicas * per_pod}, but {RECIPE} "
            f"plan.world_size = {world}",
        )
    if per_pod is not None and plan.get("devices_per_pod") not in (None, per_pod):
        result.fail(
            JOB,
            f"{where}.template.spec.containers[0].resources",
            f"{resource_name} = {per_pod} per pod, but {RECIPE} plan.devices_per_pod = {plan.get('devices_per_pod')}",
        )
    if replicas is not None and plan.get("nodes") not in (None, replicas):
        result.fail(JOB, f"{where}.replicas", f"{replicas} pods, but {RECIPE} plan.nodes = {plan.get('nodes')}")
    if bundle.recipe is not None and replicas is not None and bundle.recipe.cluster.nodes != replicas:
        result.fail(
            JOB,
            f"{where}.replicas",
            f"{replicas} pods, but {RECIPE} recipe.cluster.nodes = {bundle.recipe.cluster.nodes}",
        )
    launch = bundle.launch or {}
    expected = launch.get("nodes")
    if replicas is not None and expected != replicas:
        result.fail(
            LAUNCH, "nodes", f"{expected}, but {JOB} {where}.replicas = {replicas}: every pod's launcher would exit 2"
        )
    nproc = launch.get("nproc_per_node")
    if per_pod is not None and nproc != per_pod:
        result.fail(
            LAUNCH,
            "nproc_per_node",
            f"torchrun starts {nproc} processes per pod, but the pod gets {per_pod} × {resource_name}",
        )
    _check_gang(result, bundle, replicas)
    if result.status is Status.PASS and replicas is not None and per_pod is not None:
        result.reason = f"{replicas} pods × {per_pod} = world size {world}"
    return result


def _check_gang(result: Result, bundle: Bundle, replicas: int | None) -> None:
    """The Job's gang matches the rendezvous launch.json asks for: every pod (torchrun's static rendezvous), or the
    elastic range's fewest (``elastic.min_nodes``, torchrun's --nnodes MIN:MAX, plan/rescale.py) and the rendezvous
    pod they meet at (:func:`_check_rendezvous_task`)."""
    job_min = as_int(((bundle.job or {}).get("spec") or {}).get("minAvailable"))
    elastic = (bundle.launch or {}).get("elastic")
    low = as_int(elastic.get("min_nodes")) if isinstance(elastic, dict) else None
    meeting = _check_rendezvous_task(result, bundle, elastic) if isinstance(elastic, dict) else 0
    if job_min is None or replicas is None:
        return
    if low is not None and job_min != low + meeting:
        pods = f"{low} + the rendezvous pod" if meeting else str(low)
        result.fail(
            JOB,
            "spec.minAvailable",
            f"{job_min}, but {LAUNCH} elastic.min_nodes = {low}: the gang is {pods}; the Job would wait for pods "
            "torchrun's elastic rendezvous goes on without, or start with fewer than it needs",
        )
    elif low is None and job_min < replicas:
        result.fail(
            JOB,
            "spec.minAvailable",
            f"{job_min} < {replicas} replicas: torchrun's static rendezvous needs "
            "every pod, so the Job must be gang-scheduled (minAvailable = replicas)",
        )


def _check_rendezvous_task(result: Result, bundle: Bundle, elastic: dict[str, Any]) -> int:
    """The rendezvous task launch.json's ``elastic.rendezvous`` names is the Job's: one pod, the image's launcher
    serving the store (bundle/documents.py); the pods it adds to the gang (0 where launch.json names none)."""
    named = elastic.get("rendezvous")
    if named is None:
        return 0
    name = named.get("task_name") if isinstance(named, dict) else None
    tasks = ((bundle.job or {}).get("spec") or {}).get("tasks") or []
    found = [(i, t) for i, t in enumerate(tasks) if isinstance(t, dict) and t.get("name") == name]
    if not found:
        result.fail(JOB, "spec.tasks", f"no task {name!r}, the rendezvous pod {LAUNCH} elastic.rendezvous names")
        return 1
    index, task = found[0]
    if as_int(task.get("replicas")) != 1:
        result.fail(JOB, f"spec.tasks[{index}].replicas", f"{task.get('replicas')}, but the rendezvous is one pod")
    args = container_of(task).get("args")
    if args != [filenames.SERVE_RENDEZVOUS]:
        result.fail(
            JOB,
            f"spec.tasks[{index}].template.spec.containers[0].args",
            f"{args}, but the rendezvous pod's launcher serves the store only with [{filenames.SERVE_RENDEZVOUS!r}]",
        )
    return 1


def check_task_env(bundle: Bundle) -> Result:
    result = Result(
        "consistency.task-env", "the launcher reads VC_<TASK>_* of the Job's task; env and svc plugins enabled"
    )
    located = task_of(bundle.job)
    if located is None or bundle.launch is None:
        return result.skip("needs volcano-job.yaml (with a task) and launch.json")
    index, task = located
    task_name = str(task.get("name", ""))
    want = task_env_name(task_name)
    read = bundle.launch.get("task_env")
    if read != want:
        result.fail(
            LAUNCH,
            "task_env",
            f"the launcher reads VC_{read}_*, but the Job's task is named {task_name!r} "
            f"(the svc plugin sets VC_{want}_HOSTS / VC_{want}_NUM)",
        )
    plugins = ((bundle.job.get("spec") or {}).get("plugins")) or {}
    if not isinstance(plugins, dict):
        plugins = {}
    if "env" not in plugins:
        result.fail(JOB, "spec.plugins.env", "the launcher reads VC_TASK_INDEX, which only the env plugin sets")
    if "svc" not in plugins:
        result.fail(JOB, "spec.plugins.svc", f"the launcher reads VC_{want}_HOSTS, which only the svc plugin sets")
    if bundle.plan.get("job_name") and (bundle.job.get("metadata") or {}).get("name") != bundle.plan["job_name"]:
        result.fail(
            JOB,
            "metadata.name",
            f"{(bundle.job.get('metadata') or {}).get('name')!r}, but {RECIPE} "
            f"plan.job_name = {bundle.plan['job_name']!r}",
        )
    if result.status is Status.PASS:
        result.reason = f"task {task_name!r} → VC_{want}_HOSTS / VC_{want}_NUM"
    return result


def check_device(bundle: Bundle) -> Result:
    result = Result("consistency.device", "device resource, labels, backend and DS_ACCELERATOR match the hardware")
    located = task_of(bundle.job)
    if located is None or bundle.recipe is None:
        return result.skip("needs volcano-job.yaml (with a task) and a parseable recipe.yaml")
    index, task = located
    hw = bundle.recipe.hw
    at = f"spec.tasks[{index}].template.spec.containers[0].resources"
    resources = device_resources(container_of(task))
    if hw.device_resource:
        if hw.device_resource not in resources:
            result.fail(
                JOB,
                at,
                f"no {hw.device_resource} request/limit: pods would land without {hw.name} devices",
                hint=f"found: {', '.join(resources) or 'none'}",
            )
        for key in resources:
            if key != hw.device_resource:
                result.fail(
                    JOB,
                    f"{at}.{key}",
                    f"requests {key}, but {RECIPE} recipe.hw.device_resource is {hw.device_resource!r}",
                )
    elif resources:
        result.fail(JOB, at, f"requests {', '.join(resources)} for a {hw.vendor} bundle")
    template = task.get("template") if isinstance(task.get("template"), dict) else {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    for key, value in hw.pod_labels.items():
        if labels.get(key) != value:
            result.fail(
                JOB,
                f"spec.tasks[{index}].template.metadata.labels.{key}",
                f"{labels.get(key)!r}, but {hw.name} needs {value!r}",
            )
    selector = (template.get("spec") or {}).get("nodeSelector") or {}
    for key, value in hw.node_selector.items():
        if selector.get(key) != value:
            result.fail(
                JOB,
                f"spec.tasks[{index}].template.spec.nodeSelector.{key}",
                f"{selector.get(key)!r}, but {hw.name} nodes are labelled {value!r}",
            )
    backend = bundle.args.get("ddp_backend")
    if backend is not None and backend != hw.comm_backend:
        result.fail(RECIPE, "training_arguments.ddp_backend", f"{backend!r}, but {hw.name} uses {hw.comm_backend!r}")
    if bundle.plan.get("comm_backend") not in (None, hw.comm_backend):
        result.fail(
            RECIPE, "plan.comm_backend", f"{bundle.plan.get('comm_backend')!r}, but {hw.name} uses {hw.comm_backend!r}"
        )
    if bundle.launch is not None and bundle.ds_config is not None:
        accelerator = (bundle.launch.get("env") or {}).get("DS_ACCELERATOR")
        if accelerator != hw.ds_accelerator:
            result.fail(
                LAUNCH, "env.DS_ACCELERATOR", f"{accelerator!r}, but DeepSpeed on {hw.name} needs {hw.ds_accelerator!r}"
            )
    if bundle.launch is not None and bundle.launch.get("device") not in (None, hw.torch_device):
        result.fail(LAUNCH, "device", f"{bundle.launch.get('device')!r}, but {hw.name} is a {hw.torch_device} device")
    if result.status is Status.PASS:
        result.reason = f"{hw.device_resource or 'CPU'} on {hw.name}, {hw.comm_backend}"
    return result


def check_batch(bundle: Bundle) -> Result:
    """ds_config batch, accumulation, precision and ZeRO stage agree with the Trainer arguments and the plan."""
    result = Result("consistency.batch", "ds_config ↔ Trainer arguments ↔ plan: batch, accumulation, precision, ZeRO")
    if not bundle.plan or not bundle.args:
        return result.skip("needs recipe.yaml's plan and training_arguments")
    plan, args, ds = bundle.plan, bundle.args, bundle.ds_config
    micro, accum = args.get("per_device_train_batch_size"), args.get("gradient_accumulation_steps")
    world = plan.get("dp_size") or plan.get("world_size")
    _plan_against_arguments(result, bundle, world)
    uses_ds = bool(args.get("deepspeed"))
    if not uses_ds or ds is None:
        if uses_ds:
            result.fail(DS, "", "training_arguments.deepspeed names it, but it is missing or unparseable")
        elif result.status is Status.PASS:
            result.reason = f"DDP: micro {micro} × accumulation {accum} × {world} = {plan.get('global_batch_size')}"
        return result
    _ds_config_against_arguments(result, bundle, world)
    if result.status is Status.PASS:
        tbs = ds.get("train_batch_size")
        total = tbs if isinstance(tbs, int) else plan.get("global_batch_size")
        result.reason = (
            f"micro {micro} × accumulation {accum} × data-parallel {world} = {total}, {plan.get('precision')}, "
            f"ZeRO-{plan.get('zero_stage')}"
        )
    return result


def _plan_against_arguments(result: Result, bundle: Bundle, world: Any) -> None:
    """recipe.yaml's plan against its Trainer arguments: micro-batch, accumulation, global batch, precision, ZeRO."""
    plan, args = bundle.plan, bundle.args
    micro, accum = args.get("per_device_train_batch_size"), args.get("gradient_accumulation_steps")
    for key, arg in (
        ("micro_batch_size", "per_device_train_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ):
        if plan.get(key) != args.get(arg):
            result.fail(RECIPE, f"training_arguments.{arg}", f"{args.get(arg)}, but plan.{key} = {plan.get(key)}")
    if (
        all(isinstance(v, int) for v in (micro, accum, world))
        and plan.get("global_batch_size") != micro * accum * world
    ):
        result.fail(
            RECIPE,
            "plan.global_batch_size",
            f"{plan.get('global_batch_size')} != micro ({micro}) × "
            f"accumulation ({accum}) × data-parallel size ({world}) = {micro * accum * world}",
        )
    precision = plan.get("precision")
    if bool(args.get("bf16")) != (precision == "bf16") or bool(args.get("fp16")) != (precision == "fp16"):
        result.fail(
            RECIPE,
            "training_arguments.bf16",
            f"bf16={args.get('bf16')}, fp16={args.get('fp16')}, but plan.precision = {precision}",
        )
    zero = plan.get("zero_stage")
    if bundle.recipe is not None and zero != bundle.recipe.parallel.zero_stage:
        result.fail(
            RECIPE, "plan.zero_stage", f"{zero}, but recipe.parallel.zero_stage = {bundle.recipe.parallel.zero_stage}"
        )
    uses_ds = bool(args.get("deepspeed"))
    if zero and not uses_ds:
        result.fail(RECIPE, "training_arguments.deepspeed", f"not set, but plan.zero_stage = {zero}")
    if uses_ds and args.get("deepspeed") != DS:
        result.fail(RECIPE, "training_arguments.deepspeed", f"{args.get('deepspeed')!r}: the bundle's config is {DS}")


def _ds_config_against_arguments(result: Result, bundle: Bundle, world: Any) -> None:
    """ds_config against the Trainer arguments and the plan: the values the Trainer compares (it refuses to start
    on a mismatch), the batch DeepSpeed derives, precision, the ZeRO stage and its offload devices."""
    plan, args, ds = bundle.plan, bundle.args, bundle.ds_config
    micro, accum = args.get("per_device_train_batch_size"), args.get("gradient_accumulation_steps")
    precision, zero = plan.get("precision"), plan.get("zero_stage")
    for key, want, source in (
        ("train_micro_batch_size_per_gpu", micro, "training_arguments.per_device_train_batch_size"),
        ("gradient_accumulation_steps", accum, "training_arguments.gradient_accumulation_steps"),
        ("gradient_clipping", args.get("max_grad_norm"), "training_arguments.max_grad_norm"),
    ):
        value = ds.get(key)
        if value != "auto" and value is not None and value != want:
            result.fail(
                DS, key, f"{value}, but {RECIPE} {source} = {want} (the Trainer refuses to start on a mismatch)"
            )
    tbs = ds.get("train_batch_size")  # absent under TP (see consistency.tensor-parallel): DeepSpeed derives it
    if isinstance(tbs, int) and all(isinstance(v, int) for v in (micro, accum, world)) and tbs != micro * accum * world:
        result.fail(
            DS,
            "train_batch_size",
            f"{tbs} != micro ({micro}) × accumulation ({accum}) × world ({world}) = {micro * accum * world}",
        )
    for kind in ("bf16", "fp16"):
        section = ds.get(kind) if isinstance(ds.get(kind), dict) else {}
        enabled = section.get("enabled", False)
        if enabled != "auto" and bool(enabled) != (precision == kind):
            result.fail(DS, f"{kind}.enabled", f"{enabled}, but {RECIPE} plan.precision = {precision}")
    zero_cfg = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
    if zero_cfg.get("stage", 0) != zero:
        result.fail(DS, "zero_optimization.stage", f"{zero_cfg.get('stage')}, but {RECIPE} plan.zero_stage = {zero}")
    if zero == 3 and zero_cfg.get("stage3_gather_16bit_weights_on_model_save") is not True:
        result.fail(
            DS,
            "zero_optimization.stage3_gather_16bit_weights_on_model_save",
            "must be true under ZeRO-3, or the saved model holds empty placeholders instead of weights",
        )
    if bundle.recipe is not None:
        par = bundle.recipe.parallel
        for key, where in (("offload_optimizer", par.offload_optimizer), ("offload_param", par.offload_param)):
            device = (zero_cfg.get(key) or {}).get("device", "none") if isinstance(zero_cfg.get(key), dict) else "none"
            if device != where:
                result.fail(DS, f"zero_optimization.{key}.device", f"{device}, but recipe.parallel.{key} = {where}")


def check_precision(bundle: Bundle) -> Result:
    result = Result("consistency.precision", "precision supported by the hardware")
    if bundle.recipe is None or not bundle.plan:
        return result.skip("needs a parseable recipe.yaml")
    hw, precision = bundle.recipe.hw, bundle.plan.get("precision")
    if precision not in ("bf16", "fp16", "fp32"):
        result.fail(RECIPE, "plan.precision", f"{precision!r} is not bf16, fp16 or fp32")
    else:
        for problem in resolve_precision(precision, hw)[1]:
            result.fail(RECIPE, "plan.precision", problem.message, problem.hint)
    if result.status is Status.PASS:
        result.reason = f"{precision} on {hw.name}"
    return result


def check_storage(bundle: Bundle) -> Result:
    result = Result("consistency.storage", "output_dir on the PVC mount: checkpoints survive a pod")
    located = task_of(bundle.job)
    if located is None or not bundle.args:
        return result.skip("needs volcano-job.yaml (with a task) and recipe.yaml's training_arguments")
    index, task = located
    spec = (task.get("template") or {}).get("spec") or {}
    claims = {
        v.get("name"): (v.get("persistentVolumeClaim") or {}).get("claimName")
        for v in spec.get("volumes") or []
        if isinstance(v, dict) and v.get("persistentVolumeClaim")
    }
    mounts = [
        m.get("mountPath")
        for m in container_of(task).get("volumeMounts") or []
        if isinstance(m, dict) and m.get("name") in claims and not m.get("readOnly")
    ]
    mounts += [v.get("mountPath") for v in ((bundle.job.get("spec") or {}).get("volumes") or []) if isinstance(v, dict)]
    mounts = [m for m in mounts if isinstance(m, str)]
    output_dir = str(bundle.args.get("output_dir", ""))
    if not mounts:
        result.fail(
            JOB,
            f"spec.tasks[{index}].template.spec.volumes",
            "no writable PersistentVolumeClaim mount: checkpoints would die with the pod",
        )
    elif not any(under(output_dir, m) for m in mounts):
        result.fail(
            RECIPE,
            "training_arguments.output_dir",
            f"{output_dir} is not under the PVC mount ({', '.join(mounts)}): checkpoints would die with the pod",
        )
    if bundle.plan.get("output_dir") not in (None, output_dir):
        result.fail(
            RECIPE,
            "plan.output_dir",
            f"{bundle.plan.get('output_dir')}, but training_arguments.output_dir = {output_dir}",
        )
    if bundle.recipe is not None and mounts:
        paths = {"data.path": bundle.recipe.data.path, "model.name_or_path": bundle.recipe.model.name_or_path}
        for key, path in off_volumes(paths, mounts):
            result.fail(RECIPE, f"recipe.{key}", f"{path} is on no volume of the pod ({', '.join(mounts)})")
    if result.status is Status.PASS:
        result.reason = f"{output_dir} under {next(m for m in mounts if under(output_dir, m))}"
    return result


def check_port(bundle: Bundle) -> Result:
    result = Result("consistency.port", "rendezvous port: launch.json master_port = plan = container port")
    located = task_of(bundle.job)
    if located is None or bundle.launch is None or not bundle.plan:
        return result.skip("needs volcano-job.yaml, launch.json and recipe.yaml's plan")
    index, task = located
    port = bundle.launch.get("master_port")
    if port != bundle.plan.get("master_port"):
        result.fail(LAUNCH, "master_port", f"{port}, but {RECIPE} plan.master_port = {bundle.plan.get('master_port')}")
    ports = [p.get("containerPort") for p in container_of(task).get("ports") or [] if isinstance(p, dict)]
    if ports and port not in ports:
        result.fail(
            JOB,
            f"spec.tasks[{index}].template.spec.containers[0].ports",
            f"declares {ports}, but the launcher rendezvous on {port}",
        )
    if result.status is Status.PASS:
        result.reason = f"port {port}"
    return result
