"""Hostile and malformed input, as a new user and an attacker would try it.

The promise for every bad input: exit code 2, one line per problem naming the key, no traceback, and nothing
written — a fresh target stays absent and a previous bundle stays byte for byte. One table-driven test per class of
input (Kubernetes names, environment names, references, paths, interpolations, numbers, output paths, team recipe
trees, Hydra's own grammar), and the injection payloads fed to every text field of the recipe: each value either
arrives byte for byte where it lands (recipe.yaml, launch.json, the Job, the process environment, the README's
commands) or is refused with its key.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import typing
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from click.testing import CliRunner

from recipekit.base.errors import RecipeError
from recipekit.base.paths import RECIPES_DIR
from recipekit.bundle.build import Resolved, compile_bundle
from recipekit.bundle.files import JOB, LAUNCH, MANIFEST, README, RECIPE, RUN
from recipekit.bundle.render import markdown_code
from recipekit.bundle.runfiles import digest_of, with_digest
from recipekit.cli import main
from recipekit.image.matrix import load_images
from recipekit.plan.plan import make_plan
from recipekit.recipe.compose import Composed, compose
from recipekit.recipe.schema import field_types, sections_in, to_data
from recipekit.recipe.sections import Recipe, parse_recipe
from recipekit.runtime.launch import Topology, environment
from tests.measure import Measured, measure


# ----------------------------------------------------------------------------------------------------- helpers
def snapshot(path: Path) -> Any:
    """Every file under ``path`` with its bytes (None when ``path`` does not exist or is not reachable); outside the
    test's own directories (``/``, ``/proc``), just the names of its entries."""
    try:
        if not path.is_dir():
            return path.read_bytes() if path.is_file() else None
        if not str(path).startswith(tempfile.gettempdir()):
            return sorted(os.listdir(path))
        return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    except OSError:
        return None


@pytest.fixture(scope="module")
def previous_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle built once; each case replaces a copy of it."""
    target = tmp_path_factory.mktemp("previous") / "bundle"
    result = CliRunner().invoke(main, ["build", "recipe=tiny_sft", "-o", str(target)])
    assert result.exit_code == 0, result.output
    return target


def write_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def preset(values: dict[str, Any]) -> dict[str, str]:
    """A team tree holding ``recipe=hostile``: the tiny_sft preset with ``values`` merged in, written as YAML — the
    way to deliver any text (newlines, NUL escapes, any byte) into a recipe value."""
    base = yaml.safe_load((RECIPES_DIR / "recipe" / "tiny_sft.yaml").read_text())
    merged = copy.deepcopy(base)
    for dotted, value in values.items():
        node = merged
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    merged["name"] = "hostile"
    return {"recipe/hostile.yaml": "# @package _global_\n" + yaml.safe_dump(merged, sort_keys=False)}


@dataclasses.dataclass(frozen=True)
class Case:
    """One hostile input: CLI arguments (``{team}`` is the team tree), team files, and the key the error must name."""

    id: str
    args: tuple[str, ...]
    key: str
    files: dict[str, str | bytes] = dataclasses.field(default_factory=dict)
    command: str = "build"


def by_override(key: str, value: str, *base: str, name: str = "") -> Case:
    return Case(name or f"{key}={value!r}"[:60], ("recipe=tiny_sft", *base, f"{key}={value}"), key.lstrip("+~"))


def by_file(key: str, value: Any, name: str = "") -> Case:
    return Case(
        name or f"{key}: {value!r} (YAML)"[:60], ("--recipes", "{team}", "recipe=hostile"), key, preset({key: value})
    )


def check_refused(case: Case, tmp_path: Path, target: Path) -> None:
    """Run ``case`` against ``target`` and assert the promise: exit 2, key named, no traceback, target untouched."""
    team = write_tree(tmp_path / "team", case.files) if case.files else tmp_path / "team"
    args = [a.replace("{team}", str(team)) for a in case.args]
    before, siblings = snapshot(target), snapshot(target.parent)
    command = [case.command, *args]
    if case.command == "build":
        command += ["-o", str(target)]
    result = CliRunner().invoke(main, command)
    output = result.output
    assert result.exit_code == 2, f"{case.id}: exit {result.exit_code}\n{output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), f"{case.id}: {result.exception!r}"
    assert "Traceback" not in output, output
    problems = [line for line in output.splitlines() if line.startswith("  - ")]
    assert problems and any(case.key in line for line in problems), f"{case.id}: {case.key} not named in\n{output}"
    assert snapshot(target) == before, f"{case.id}: the target changed"
    assert snapshot(target.parent) == siblings, f"{case.id}: something was written beside the target"


def run_class(cases: list[Case], case: Case, state: str, tmp_path: Path, previous_bundle: Path) -> None:
    target = tmp_path / "out" / "bundle"
    if state == "previous":
        shutil.copytree(previous_bundle, target)
    check_refused(case, tmp_path, target)


STATES = ("fresh", "previous")


def table(cases: list[Case]) -> Any:
    return pytest.mark.parametrize("case, state", [pytest.param(c, s, id=f"{c.id}@{s}") for c in cases for s in STATES])


# ----------------------------------------------------------------------------------------------- 1. k8s names
LABELS = ("cluster.namespace", "cluster.task_name")
SUBDOMAINS = ("cluster.queue", "cluster.priority_class", "cluster.pvc_claim")
K8S_NAMES = [
    case
    for key in (*LABELS, *SUBDOMAINS)
    for case in (
        by_override(key, "Team-A", name=f"{key} upper case"),
        by_override(key, "team_a", name=f"{key} underscore"),
        by_override(key, "a" * (64 if key in LABELS else 254), name=f"{key} too long"),
        by_override(key, "''", name=f"{key} empty"),
        by_file(key, "team\n", name=f"{key} trailing newline"),
        by_file(key, "-team", name=f"{key} leading dash"),
    )
]


@table(K8S_NAMES)
def test_kubernetes_names_follow_the_api_servers_rules(case: Case, state: str, tmp_path: Path, previous_bundle) -> None:
    run_class(K8S_NAMES, case, state, tmp_path, previous_bundle)


# ----------------------------------------------------------------------------------- 2. environment var names
ENV_NAMES = [
    by_override("+hw.env.1", "x", name="digit"),
    by_override("+hw.env.A-B", "x", name="dash"),
    by_file("hw.env", {"A=$(id)": "x"}, name="assignment and command substitution"),
    by_file("hw.env", {"A B": "x"}, name="space"),
    by_file("hw.env", {"": "x"}, name="empty"),
    by_file("hw.env", {"OK": "line\nnext"}, name="newline in a value"),
    by_file("hw.env", {"OK": "nul\x00"}, name="NUL in a value"),
]


@table(ENV_NAMES)
def test_environment_names_are_c_identifiers(case: Case, state: str, tmp_path: Path, previous_bundle) -> None:
    run_class(ENV_NAMES, dataclasses.replace(case, key="hw.env"), state, tmp_path, previous_bundle)


# ---------------------------------------------------------------------------------------- 3. references
REFERENCES = [
    by_override("cluster.image_registry", "Registry_X", name="registry upper case path"),
    by_override("cluster.image_registry", "'reg.example.com/a b'", name="registry with a space"),
    by_override("cluster.image_registry", "'reg.example.com/$(id)'", name="registry with a payload"),
    by_override("cluster.image_registry", "reg.example.com:port/x", name="registry bad port"),
    by_override("hw.device_resource", "gpu", name="resource without domain"),
    by_override("hw.device_resource", "kubernetes.io/gpu", name="resource in kubernetes.io"),
    by_override("hw.device_resource", "'nvidia.com/g pu'", name="resource with a space"),
    by_file("hw.node_selector", {"bad key!": "x"}, name="label key"),
    by_file("hw.pod_labels", {"ok": "v" * 64}, name="label value too long"),
    by_override("cluster.socket_ifname", "eth0/1", name="interface with slash"),
    by_override("cluster.socket_ifname", "eth0:1", name="interface with colon"),
    by_override("cluster.socket_ifname", "averyveryverylongname", name="interface too long"),
    by_file("cluster.socket_ifname", "eth0 }", name="interface with brace"),
]


@table(REFERENCES)
def test_registry_resource_label_and_interface_strings_are_references(
    case: Case, state: str, tmp_path: Path, previous_bundle
) -> None:
    run_class(REFERENCES, case, state, tmp_path, previous_bundle)


# ---------------------------------------------------------------------------------------------------- 4. paths
PATHS = [
    by_override("cluster.mount_path", "mnt/shared", name="relative mount"),
    by_override("cluster.mount_path", "/dev/shm", name="mount on /dev/shm"),
    by_override("cluster.mount_path", "/workspace", name="mount over the bundle"),
    by_override("cluster.mount_path", "/", name="mount on root"),
    by_override("cluster.mount_path", "/usr/share", name="mount under /usr"),
    by_override("cluster.output_dir", "/mnt/shared/../etc", name="output dir with .."),
    by_override("cluster.output_dir", "runs", name="relative output dir"),
    by_override("cluster.output_dir", "/elsewhere/runs", name="output dir off the volume"),
    by_override("hw.host_mounts", "[/opt/a_b,/opt/a-b]", name="colliding host volume names"),
    by_override("hw.host_mounts", "[usr/local/x]", name="relative host mount"),
    by_override("hw.host_mounts", "[/mnt/shared]", name="host mount over the PVC"),
    by_override("parallel.nvme_path", "nvme", name="relative nvme path"),
    by_override("parallel.nvme_path", "/mnt/shared", "parallel=zero3_nvme", name="nvme scratch on the PVC"),
    by_override("hw.host_mounts", "[/dev/shm]", name="host mount over /dev/shm"),
]


@table(PATHS)
def test_paths_are_absolute_normalised_and_clear_of_each_other(
    case: Case, state: str, tmp_path: Path, previous_bundle
) -> None:
    run_class(PATHS, case, state, tmp_path, previous_bundle)


# ----------------------------------------------------------------------------------------- 5. interpolations
INTERPOLATIONS = [
    by_override("description", "${oc.env:HOME}", name="oc.env in an override"),
    by_override("description", "'${now:%Y-%m-%d}'", name="now in a quoted override"),
    by_override("+hw.env.X", "${oc.env:PATH}", name="secret into the env"),
    by_override("data.path", "/data/${oc.decode:'x'}", name="any resolver"),
    by_override("description", "${nope.missing}", name="reference to nothing"),
    by_file("description", "${oc.env:HOME}", name="oc.env in a team file"),
    by_file("hw.env", {"TOKEN": "${oc.env:SECRET_TOKEN,x}"}, name="secret in a team file"),
]


@table(INTERPOLATIONS)
def test_only_references_between_recipe_keys_are_resolved(
    case: Case, state: str, tmp_path: Path, previous_bundle
) -> None:
    run_class(INTERPOLATIONS, case, state, tmp_path, previous_bundle)


def test_a_reference_between_recipe_keys_is_resolved() -> None:
    raw = compose(["recipe=tiny_sft", "description=${model.name} on ${hw.name}"]).raw
    assert raw["description"] == "tiny_llama on cpu"


# ------------------------------------------------------------------------------------------------- 6. numbers
NUMBERS = [
    by_override("hw.peak_tflops_bf16", "inf", name="infinite"),
    by_override("hw.peak_tflops_bf16", "nan", name="not a number"),
    by_override("hw.peak_tflops_bf16", "1e308", name="huge float"),
    by_override("hw.peak_tflops_bf16", "1e-320", name="denormal"),
    by_override("train.seed", "9" * 5000, name="5000-digit integer"),
    by_override("train.max_steps", str(2**70), name="beyond 64 bits"),
    by_override("cluster.nodes", "1e3", name="float for an integer"),
    by_file("train.learning_rate", float("inf"), name="infinite in a file"),
    by_file("model.rms_norm_eps", 5e-324, name="denormal in a file"),
    Case("pipeline beyond layers", ("recipe=tiny_sft", "parallel.pipeline_parallel=64"), "parallel.pipeline_parallel"),
    Case(
        "plan: pipeline beyond layers",
        ("recipe=llama3_8b_sft", "cluster.nodes=8", "parallel.pipeline_parallel=64"),
        "parallel.pipeline_parallel",
        command="plan",
    ),
]


@table(NUMBERS)
def test_numbers_are_finite_and_bounded(case: Case, state: str, tmp_path: Path, previous_bundle) -> None:
    run_class(NUMBERS, case, state, tmp_path, previous_bundle)


# ---------------------------------------------------------------------------------------------- 7. team trees
ALIAS_BOMB = "# @package _global_\nname: bomb\na: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)
TEAM_TREES = [
    Case("alias bomb", ("--recipes", "{team}", "recipe=bomb"), "bomb.yaml", {"recipe/bomb.yaml": ALIAS_BOMB}),
    Case(
        "alias bomb in an unused option",
        ("--recipes", "{team}", "recipe=tiny_sft"),
        "bomb.yaml",
        {"model/bomb.yaml": ALIAS_BOMB},
    ),
    Case(
        "recursive alias",
        ("--recipes", "{team}", "recipe=loop"),
        "loop.yaml",
        {"recipe/loop.yaml": "# @package _global_\na: &a [*a]\n"},
    ),
    Case(
        "not UTF-8",
        ("--recipes", "{team}", "recipe=latin1"),
        "latin1.yaml",
        {"recipe/latin1.yaml": b"# @package _global_\ndescription: caf\xe9\n"},
    ),
    Case(
        "huge integer",
        ("--recipes", "{team}", "recipe=big"),
        "big.yaml",
        {"recipe/big.yaml": "# @package _global_\ntrain:\n  seed: " + "9" * 5000 + "\n"},
    ),
    Case(
        "nested 200 deep",
        ("--recipes", "{team}", "recipe=deep"),
        "deep.yaml",
        {"recipe/deep.yaml": "# @package _global_\nx: " + "[" * 200 + "]" * 200 + "\n"},
    ),
    Case(
        "not YAML",
        ("--recipes", "{team}", "recipe=broken"),
        "broken.yaml",
        {"recipe/broken.yaml": "# @package _global_\nx: [1, 2\n"},
    ),
    Case(
        "python object tag",
        ("--recipes", "{team}", "recipe=tag"),
        "tag.yaml",
        {"recipe/tag.yaml": "# @package _global_\ndescription: !!python/object/apply:os.system [id]\n"},
    ),
    Case(
        "null key",
        ("--recipes", "{team}", "recipe=nullkey"),
        "train",
        {"recipe/nullkey.yaml": "# @package _global_\ntrain:\n  null: 1\n"},
    ),
    Case(
        "list with a bomb",
        (
            "--recipes",
            "{team}",
        ),
        "bomb.yaml",
        {"hw/bomb.yaml": ALIAS_BOMB},
        command="list",
    ),
    Case(
        "show with a bomb",
        ("--recipes", "{team}", "recipe=tiny_sft"),
        "bomb.yaml",
        {"hw/bomb.yaml": ALIAS_BOMB},
        command="show",
    ),
    Case(
        "plan with a bomb",
        ("--recipes", "{team}", "recipe=tiny_sft"),
        "bomb.yaml",
        {"hw/bomb.yaml": ALIAS_BOMB},
        command="plan",
    ),
]


@table(TEAM_TREES)
def test_team_recipe_trees_are_read_safely(case: Case, state: str, tmp_path: Path, previous_bundle) -> None:
    run_class(TEAM_TREES, case, state, tmp_path, previous_bundle)


def test_the_alias_bomb_is_small_and_refused_fast(tmp_path: Path) -> None:
    """The 700-byte class of file that hung `build` until killed: refused in well under a second, in a real process."""
    assert len(ALIAS_BOMB) < 700
    write_tree(tmp_path / "team", {"recipe/bomb.yaml": ALIAS_BOMB})
    result = subprocess.run(
        [sys.executable, "-m", "recipekit.cli", "build", "--recipes", str(tmp_path / "team"), "recipe=bomb"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "alias bomb" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "bundles").exists()


# -------------------------------------------------------------------------------------------- 8. hydra grammar
HYDRA = [
    Case("hydra.job.name", ("recipe=tiny_sft", "hydra.job.name=x"), "hydra.job.name"),
    Case("+hydra.run.dir", ("recipe=tiny_sft", "+hydra.run.dir=/tmp/x"), "hydra.run.dir"),
    Case("hydra group", ("recipe=tiny_sft", "hydra/launcher=basic"), "hydra/launcher"),
    Case("3000 deep", ("recipe=tiny_sft", "+x=" + "[" * 3000 + "]" * 3000), "x"),
    Case("3000 deep dicts", ("recipe=tiny_sft", "+x=" + "{a:" * 3000 + "1" + "}" * 3000), "x"),
    Case("unparsable", ("recipe=tiny_sft", "cluster.queue=a;b"), "cluster.queue"),
    Case("show: hydra", ("recipe=tiny_sft", "hydra.job.name=x"), "hydra.job.name", command="show"),
    Case("plan: 3000 deep", ("recipe=tiny_sft", "+x=" + "[" * 3000 + "]" * 3000), "x", command="plan"),
]


@table(HYDRA)
def test_hydra_grammar_abuse_is_refused_before_hydra_parses_it(
    case: Case, state: str, tmp_path: Path, previous_bundle
) -> None:
    run_class(HYDRA, case, state, tmp_path, previous_bundle)


# -------------------------------------------------------------------------------------------- 9. output paths
def output_cases(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "loop").symlink_to("loop")
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    foreign = {
        "list": '["recipekit_version"]',
        "string": '"recipekit_version"',
        "number": "5",
        "no-files": '{"recipekit_version": "0.1.0"}',
        "bad-digest": '{"recipekit_version": "0.1.0", "files": {"run.sh": "abc"}}',
        "escaping-name": '{"recipekit_version": "0.1.0", "files": {"../x": "' + "0" * 64 + '"}}',
        "not-json": "{",
        "deep-json": "[" * 100_000,
        "latin1": b'{"recipekit_version": "caf\xe9"}',
    }
    paths = {
        "parent is a file": tmp_path / "a_file" / "bundle",
        "symlink loop": tmp_path / "loop",
        "under a symlink loop": tmp_path / "loop" / "bundle",
        "name too long": tmp_path / ("n" * 300),
        "/proc": Path("/proc/recipekit-no-such-dir/bundle"),
        "root": Path("/"),
    }
    if os.geteuid() != 0:  # root writes into read-only directories
        paths["read-only parent"] = readonly / "bundle"
    for name, content in foreign.items():
        directory = tmp_path / f"foreign-{name}"
        directory.mkdir()
        (directory / MANIFEST).write_bytes(content.encode() if isinstance(content, str) else content)
        (directory / "notes.txt").write_text("keep me")
        paths[f"foreign manifest: {name}"] = directory
    return paths


OUTPUT_NAMES = [
    "parent is a file",
    "symlink loop",
    "under a symlink loop",
    "name too long",
    "/proc",
    "root",
    "read-only parent",
    *(
        f"foreign manifest: {n}"
        for n in (
            "list",
            "string",
            "number",
            "no-files",
            "bad-digest",
            "escaping-name",
            "not-json",
            "deep-json",
            "latin1",
        )
    ),
]


@pytest.mark.parametrize("name", OUTPUT_NAMES)
def test_output_path_errors_are_one_line(name: str, tmp_path: Path) -> None:
    paths = output_cases(tmp_path)
    if name not in paths:
        pytest.skip("running as root: a read-only directory is writable")
    target = paths[name]
    check_refused(Case(name, ("recipe=tiny_sft",), str(target)), tmp_path, target)


# ------------------------------------------------------------------------------- injection payloads per field
#: The classic payloads, appended to a valid value of each field.
PAYLOADS = {
    "semicolon": "; id",
    "command substitution": "$(id)",
    "backticks": "`id`",
    "newline": "\nid",
    "tab": "\tid",
    "closing brace": "}",
    "quotes": "'\"",
    "pipe": "|x",
    "ampersands": " && id",
    "markdown": "<b>*x*</b> [l](u) # h",
    "bidi override": "\u202eid",
    "nul": "\x00",
}


def text_fields() -> list[str]:
    """Dotted keys of every text field of the recipe (str, or str | None), found from the schema."""
    found = []

    def walk(section: type, prefix: str) -> None:
        for name, annotation in field_types(section).items():
            key = f"{prefix}{name}"
            inner = [a for a in get_args(annotation) if a is not type(None)] if get_origin(annotation) else []
            if annotation is str or inner == [str]:
                found.append(key)
            listed = get_origin(annotation) is list  # a list of records: the payload goes into its first item
            for sub in sections_in(annotation):
                walk(sub, key + (".0." if listed else "."))

    walk(Recipe, "")
    return sorted(set(found))


#: A valid value per field for the payloads to extend (the rest start from tiny_sft's own value).
STARTS = {
    "cluster.priority_class": "high",
    "cluster.socket_ifname": "eth0",
    "hw.device_resource": "example.com/dev",
    "hw.visible_devices_env": "X",
    "parallel.nvme_path": "/local_nvme",
    "cluster.pip_extra_index_url": "https://mirror.example.com/simple",
    "cluster.torch_index_url": "https://mirror.example.com/whl/cpu",
    "cluster.base_image_registry": "mirror.example.com",
}
#: Mapping and list fields: how a payload enters them.
CONTAINERS = {
    "hw.env (name)": ("hw.env", lambda p: {"X" + p: "1"}),
    "hw.env (value)": ("hw.env", lambda p: {"X": "1" + p}),
    "hw.node_selector (key)": ("hw.node_selector", lambda p: {"k" + p: "v"}),
    "hw.node_selector (value)": ("hw.node_selector", lambda p: {"k": "v" + p}),
    "hw.pod_labels (value)": ("hw.pod_labels", lambda p: {"k": "v" + p}),
    "hw.host_mounts": ("hw.host_mounts", lambda p: ["/opt/driver" + p]),
}


@pytest.fixture(scope="module")
def base_raw() -> dict[str, Any]:
    return compose(["recipe=tiny_sft"]).raw


def _get(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _set(data: Any, dotted: str, value: Any) -> None:
    """``value`` at ``dotted``; a numeric part (``tolerations.0.key``) is an item of a list made there."""
    *parents, last = dotted.split(".")
    for part, after in zip(parents, [*parents[1:], last]):
        empty: Any = [] if after.isdigit() else {}
        if part.isdigit():
            while len(data) <= int(part):
                data.append(empty)
            data = data[int(part)]
        else:
            data = data.setdefault(part, empty)
    if last.isdigit():
        data.append(value)
    else:
        data[last] = value


INJECTIONS = [(field, name) for field in text_fields() for name in PAYLOADS] + [
    (field, name) for field in CONTAINERS for name in PAYLOADS
]


@pytest.mark.parametrize("field, payload", INJECTIONS, ids=[f"{f}:{p}" for f, p in INJECTIONS])
def test_injection_payload_arrives_byte_for_byte_or_is_refused(base_raw, field: str, payload: str) -> None:
    raw = copy.deepcopy(base_raw)
    text = PAYLOADS[payload]
    if field in CONTAINERS:
        key, make = CONTAINERS[field]
        value = make(text)
    else:
        key = field
        value = (STARTS.get(field) or _get(raw, field) or "x") + text
        if field == "mode.kind":
            pytest.skip("a tag")
    _set(raw, key, value)
    images = load_images()
    try:
        recipe = parse_recipe(raw)
        plan = make_plan(recipe, images)
    except RecipeError as err:
        named = re.sub(r"\.(\d+)\.", r"[\1].", key)  # the problems index list items: tolerations[0].key
        assert any(p.key.startswith(named) for p in err.problems), f"{named} not named: {err}"
        for problem in err.problems:
            assert "\n" not in str(problem) and "\x00" not in str(problem) and "\u202e" not in str(problem)
        return
    # accepted: it must arrive byte for byte wherever it lands, and never in run.sh
    assert not any(c in text for c in "\n\x00\u202e"), "a control character was accepted"
    compiled = compile_bundle(Resolved(Composed(raw, {}, []), recipe, plan, images), allow_oom=True)
    documents, files = compiled.documents, compiled.files
    document = yaml.safe_load(files[RECIPE])
    assert _get(document["recipe"], key) == value
    assert yaml.safe_load(files[JOB]) == with_digest(documents.job, digest_of(files))
    launch = json.loads(files[LAUNCH])
    assert launch == json.loads(json.dumps(documents.launch))
    if key == "hw.env":
        env = environment(launch, Topology(0, 2, ["h0", "h1"]), {})
        child = subprocess.run(
            [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        for name, item in value.items():
            assert json.loads(child.stdout)[name] == item, "the value did not reach the process environment intact"
    needle = value if isinstance(value, str) else json.dumps(value)
    assert needle not in files[RUN].decode(), "run.sh holds a recipe value"
    check_readme(files[README].decode(), recipe, plan)


def check_readme(readme: str, recipe: Recipe, plan: Any) -> None:
    """The README's commands split back into exactly their arguments; its tables keep their cells."""
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.strip()]
    cl = recipe.cluster
    expected = {
        "docker build": ["docker", "build", "--platform", f"linux/{recipe.hw.arch}", "-t", plan.image, "."],
        "docker push": ["docker", "push", plan.image],
        "kubectl -n": None,
    }
    for line in lines:
        if line.startswith("# 2."):
            words = shlex.split(line[len("# 2.") :])
            words[-1] = words[-1].removesuffix(".")  # the sentence's full stop (a PVC name never ends in one)
            assert recipe.model.name_or_path in words and recipe.data.path in words and cl.pvc_claim in words
            continue
        if line.startswith("#"):
            continue
        words = shlex.split(line)
        for prefix, tokens in expected.items():
            if line.startswith(prefix) and tokens is not None:
                assert words == tokens
        if line.startswith("kubectl -n"):
            assert words[:3] == ["kubectl", "-n", cl.namespace]
            assert (
                plan.job_name in words
                or words[3:7] == ["create", "secret", "generic", "recipekit-run-key"]  # the run key, per namespace
                or f"app.kubernetes.io/name={plan.job_name}" in words
                or any(w == f"{plan.job_name}-{plan.task_name}-0" for w in words)
            )
    # every row of a table has its header's cells (the summary table has two columns, the exit codes four)
    width = None
    for line in readme.splitlines():
        if not line.startswith("|"):
            width = None
            continue
        cells = re.split(r"(?<!\\)\|", line)
        if width is None:
            width = len(cells)
        assert len(cells) == width, f"a table row lost its shape: {line!r}"
    assert markdown_code(recipe.model.name_or_path, cell=True) in readme
    assert markdown_code(recipe.data.path, cell=True) in readme


def test_every_text_field_is_fed_the_payloads() -> None:
    """New text fields are picked up from the schema: none escapes the payload test."""
    fields = text_fields()
    assert {"cluster.namespace", "model.name_or_path", "data.path", "description", "hw.chip"} <= set(fields)
    assert len(fields) >= 25, fields


def test_a_recipe_error_names_a_value_without_expanding_it() -> None:
    """A value is shown bounded: a 5000-digit number, a deep or shared structure never stall a message."""
    bomb: list[Any] = ["lol"] * 9
    for _ in range(9):
        bomb = [bomb] * 9
    data = to_data(parse_recipe(compose(["recipe=tiny_sft"]).raw))
    data["description"] = bomb
    data["train"]["seed"] = 10**5000
    with pytest.raises(RecipeError) as info:
        parse_recipe(data)
    text = str(info.value)
    assert "description" in text and "train.seed" in text and len(text) < 2000


# ------------------------------------------------------------------------------------------------ validate, list
def test_validate_reads_an_alias_bomb_recipe_yaml_without_expanding_it(previous_bundle, tmp_path: Path) -> None:
    """A 5 KB alias-bomb recipe.yaml hung `validate`: now a finding naming the file, promptly, no traceback."""
    from recipekit.validate.shared.loader import rehash_manifest

    bundle = tmp_path / "b"
    shutil.copytree(previous_bundle, bundle)
    bomb = "recipekit_version: x\nrecipe:\n  description: &a [" + ",".join(["lol"] * 9) + "]\n"
    for level in range(12):
        bomb += f"  k{level}: &{chr(98 + level)} [{','.join(['*' + chr(97 + level)] * 9)}]\n"
    (bundle / RECIPE).write_text(bomb)
    rehash_manifest(bundle)
    result = subprocess.run(
        [sys.executable, "-m", "recipekit.cli", "validate", str(bundle)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "recipe.yaml" in result.stdout and "alias" in result.stdout and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: (d / MANIFEST).write_text("[" * 100_000), "not UTF-8 JSON"),
        (lambda d: (d / MANIFEST).write_bytes(b"\xff\xfe"), "not UTF-8 JSON"),
        (lambda d: (d / MANIFEST).write_text("5"), "not a recipekit manifest"),
    ],
    ids=["deep JSON", "not UTF-8", "a number"],
)
def test_validate_exits_2_for_a_manifest_that_is_not_one(tmp_path: Path, make, message: str) -> None:
    (tmp_path / "b").mkdir()
    make(tmp_path / "b")
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "b")])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_list_shows_a_team_description_as_written(tmp_path: Path) -> None:
    """rich would read "[/x]" as a closing tag and raise; a description is text, not markup."""
    write_tree(tmp_path / "team", {"hw/odd.yaml": 'name: odd\ndescription: "[/oops] [bold]x"\n'})
    result = CliRunner().invoke(main, ["list", "hw", "--recipes", str(tmp_path / "team")])
    assert result.exit_code == 0, result.output
    assert "[/oops] [bold]x" in result.output


# ------------------------------------------------------------------------------------------- domains, loader
@pytest.mark.parametrize(
    "domain, good, bad",
    [
        ("DNS_LABEL", ["default", "team-a", "a" * 63, "0x"], ["Team", "team_a", "a" * 64, "", "team\n", "-a", "a-"]),
        ("DNS_SUBDOMAIN", ["llm-shared", "a.b-c.d", "a" * 253], ["A", "a..b", "a_b", "a" * 254, ".a", "a."]),
        ("ENV_NAME", ["HCCL_BUFFSIZE", "_x", "a1"], ["1", "A-B", "A=$(id)", "A B", "", "É"]),
        (
            "IMAGE_REGISTRY",
            ["registry.example.com/llm", "localhost:5000/recipekit", "quay.io/a/b_c", "team", "reg.io:5000"],
            ["Registry_X", "reg.io/A", "reg.io/a b", "reg.io:port/x", "reg.io//x", "", "reg.io/$(id)"],
        ),
        (
            "EXTENDED_RESOURCE",
            ["huawei.com/Ascend910", "nvidia.com/gpu", "example.com/a.b_c"],
            ["gpu", "kubernetes.io/gpu", "a.kubernetes.io/x", "nvidia.com/", "/gpu", "Nvidia_Com/gpu"],
        ),
        ("LABEL_KEY", ["accelerator-type", "ring-controller.atlas", "a.b/c_d"], ["", "a/", "-a", "a b", "x" * 64]),
        ("LABEL_VALUE", ["", "module-910b-8", "a.b_c"], ["-a", "a b", "v" * 64]),
        (
            "MOUNT_PATH",
            ["/mnt/shared", "/data/", "/home/team/x"],
            ["mnt", "/", "/dev/shm", "/dev", "/workspace", "/workspace/x", "/usr", "/var", "/a/../b", "//a", "/a b"],
        ),
        ("ABSOLUTE_PATH", ["/mnt/shared/runs", "/x"], ["runs", "/a/./b", "/a/../b", "/a;b", "/a\\b"]),
        ("HOST_PATH", ["/usr/local/Ascend/driver", "/etc/x.info"], ["/", "x", "/proc/x", "/sys", "/workspace"]),
        ("IFNAMES", ["eth0", "eth0,ib0", "enp1s0f0.100"], ["eth0/1", "eth0:1", "a" * 16, "eth0 ", ",", ".."]),
        (
            "INDEX_URL",
            ["https://pypi.org/simple", "http://10.0.0.1:8080/pypi/simple/", "https://download.pytorch.org/whl/cu128"],
            ["ftp://x", "https://user:pw@host/simple", "https://h/$(id)", "https://h/a b", "https://h/'x'", "pypi.org"],
        ),
    ],
)
def test_domains_accept_real_values_and_refuse_lookalikes(domain: str, good: list[str], bad: list[str]) -> None:
    from recipekit.recipe import domains

    rule = getattr(domains, domain)
    assert [value for value in good if rule.problem(value) is not None] == []
    assert [value for value in bad if rule.problem(value) is None] == []


def test_host_volume_names_match_the_jobs_and_collide_where_they_should() -> None:
    from recipekit.recipe.k8snames import host_volume_name

    assert host_volume_name("/usr/local/Ascend/driver") == "host-usr-local-ascend-driver"
    assert host_volume_name("/a_b") == host_volume_name("/a-b") == host_volume_name("/A.B")
    assert len(host_volume_name("/" + "x" * 300)) <= 63


@pytest.mark.parametrize(
    "text, message",
    [
        (ALIAS_BOMB, "alias bomb"),
        ("a: &a [*a]\n", "refers to its own enclosing node"),
        ("a: *nowhere\n", "has no anchor before it"),
        ("x: " + "[" * 65 + "]" * 65 + "\n", "nested more than 64 levels"),
        ("x: " + "[" * 5000 + "]" * 5000 + "\n", "not valid YAML"),
        ("x: " + "1" * 5000 + "\n", "a number of 5000 characters"),
        ("x: 2024-13-45\n", "cannot construct"),
        ("a: 1\n---\nb: 2\n", "not valid YAML"),
    ],
    ids=["bomb", "recursive", "undefined", "deep", "very deep", "long number", "bad date", "two documents"],
)
def test_the_yaml_loader_refuses_before_constructing(text: str, message: str) -> None:
    from recipekit.base import yamlfile

    with pytest.raises(yamlfile.UnsafeYAML) as info:
        yamlfile.load(text, "team.yaml")
    assert message in str(info.value) and str(info.value).startswith("team.yaml") and "\n" not in str(info.value)


def test_the_yaml_loader_names_bad_bytes_and_keeps_quoted_numbers_as_text(tmp_path: Path) -> None:
    from recipekit.base import yamlfile

    (tmp_path / "latin1.yaml").write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(yamlfile.UnsafeYAML, match=r"latin1.yaml:2: is not UTF-8 text \(byte 0xe9"):
        yamlfile.read(tmp_path / "latin1.yaml")
    assert yamlfile.load("x: '" + "1" * 5000 + "'\n") == {"x": "1" * 5000}
    shared = yamlfile.load("a: &a [1, 2]\nb: *a\n")
    assert shared == {"a": [1, 2], "b": [1, 2]}


# -------------------------------------------------------------------------------------------- numbers at bounds
def test_every_number_at_its_bound_plans_estimates_and_renders(base_raw) -> None:
    """The upper bounds are sane: any value the schema accepts gives a plan, an estimate and files, or a
    RecipeError — never an overflow, a ZeroDivisionError or an infinite figure."""
    import math

    from recipekit import memory

    images = load_images()
    checked = 0
    for key, bounds in numeric_fields(Recipe):
        for name in ("le", "ge"):
            if name not in bounds or key.startswith("mode."):
                continue
            raw = copy.deepcopy(base_raw)
            _set(raw, key, bounds[name])
            try:
                recipe = parse_recipe(raw)
                plan = make_plan(recipe, images, analysis_only=True)
                estimate = memory.estimate(recipe, plan)
            except RecipeError:
                continue
            assert math.isfinite(estimate.total_gib), key
            if plan.layout.model_parallel == 1:
                full = make_plan(recipe, images)
                compile_bundle(Resolved(Composed(raw, {}, []), recipe, full, images), allow_oom=True)
            checked += 1
    assert checked > 20


def numeric_fields(section: type, prefix: str = "") -> list[tuple[str, dict[str, float]]]:
    found = []
    for field in dataclasses.fields(section):
        if typing.get_origin(field_types(section)[field.name]) is list:
            continue  # a list of sections (model.modules.layers) has no single key to set a bound at
        subs = sections_in(field_types(section)[field.name])
        if subs:
            for sub in subs:
                found.extend(numeric_fields(sub, f"{prefix}{field.name}."))
        elif field.metadata.get("bounds"):
            found.append((f"{prefix}{field.name}", field.metadata["bounds"]))
    return found


def test_a_team_file_that_is_not_a_regular_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO named like an option would block Hydra's read forever; a directory named like one would raise."""
    (tmp_path / "team" / "model" / "dir.yaml").mkdir(parents=True)
    os.mkfifo(tmp_path / "team" / "model" / "fifo.yaml")
    result = subprocess.run(
        [sys.executable, "-m", "recipekit.cli", "plan", "--recipes", str(tmp_path / "team"), "recipe=tiny_sft"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "fifo.yaml: is not a regular file" in result.stderr and "dir.yaml: is not a regular file" in result.stderr


@pytest.mark.parametrize(
    "args, flag",
    [
        (["plan", "recipe=tiny_sft", "--price", "nan"], "--price"),
        (["plan", "recipe=tiny_sft", "--price", "inf"], "--price"),
        (["plan", "recipe=tiny_sft", "--price", "1e308"], "--price"),
        (["validate", ".", "--dry-run", "--timeout", "nan"], "--timeout"),
    ],
    ids=["price nan", "price inf", "price 1e308", "timeout nan"],
)
def test_number_flags_are_finite(args: list[str], flag: str) -> None:
    """NaN passes every range comparison; an infinite price gives an infinite cost (and invalid JSON)."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and flag in result.output and "Traceback" not in result.output


# ======================================================================= surfaces beyond the recipe (issue 20)
# Each case runs the real CLI in a child process and measures it: exit 2 (or the documented refusal), at most one
# line per problem, no traceback, nothing written in the case's directory, wall time and peak RSS (os.wait4's
# rusage of that child) under the bounds below. Caches go to a directory of their own, outside the snapshot.
MAX_WALL_S = 90.0
MAX_RSS_MIB = 700


def run_measured(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 240) -> Measured:
    """``recipekit ARGS`` in a child process: its exit code, output, wall time and peak RSS (MiB)."""
    environ = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src"), **(env or {})}
    return measure([sys.executable, "-P", "-m", "recipekit.cli", *args], cwd, environ, timeout)


@dataclasses.dataclass(frozen=True)
class Probe:
    """One hostile input for a surface: ``setup`` writes it under the case directory and returns the CLI args
    (``{case}`` is that directory); ``expect`` is in the error; ``code`` the documented exit code."""

    id: str
    setup: Any
    expect: str
    code: int = 2
    cwd: str = "."
    slow: bool = False  # streams a GiB or more: marked slow


def check_probe(probe: Probe, tmp_path: Path) -> Measured:
    case = tmp_path / "case"
    case.mkdir()
    args = [a.replace("{case}", str(case)) for a in probe.setup(case)]
    cwd = case / probe.cwd
    before = snapshot(case)
    cache = tmp_path / "cache"
    result = run_measured(args, cwd, env={"XDG_CACHE_HOME": str(cache), "HOME": str(tmp_path / "home")})
    said = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("recipekit: using")]
    problems = [line for line in said if line.startswith("  - ")]
    where = f"{probe.id}: exit {result.code}, {result.wall_s:.1f} s, {result.rss_mib:.0f} MiB\n{result.stderr[-3000:]}"
    assert result.code == probe.code, where
    assert "Traceback" not in result.stderr + result.stdout, where
    assert any(probe.expect in line for line in said), where  # the reason on one line
    errors = [line for line in said if "error" in line.lower() or line.startswith("  - ")]
    assert len(errors) <= 1 + len(problems) and all(len(e) < 2000 for e in errors), where  # a header, one line each
    assert snapshot(case) == before, f"{probe.id}: something was written in the case directory"
    assert result.wall_s < MAX_WALL_S and result.rss_mib < MAX_RSS_MIB, where
    return result


def surface(probes: list[Probe]) -> Any:
    return pytest.mark.parametrize(
        "probe", [pytest.param(p, id=p.id, marks=[pytest.mark.slow] if p.slow else []) for p in probes]
    )


def _files(files: dict[str, str | bytes], *args: str) -> Any:
    def setup(case: Path) -> list[str]:
        write_tree(case, files)
        return list(args)

    return setup


# ---------------------------------------------------------------------------------------- team trees (and toml)
DOUBLING = "# @package _global_\ndefaults:\n  - tiny_sft\n  - _self_\nx0: aaaaaaaaaaaaaaaa\n" + "".join(
    f"x{i}: ${{x{i - 1}}}${{x{i - 1}}}\n" for i in range(1, 40)
)
TOML = 'name = "team"\nrecipekit = ">=0.0"\nsearch_path = ["recipes"]\n'


def _owned_by_another_user(case: Path) -> list[str]:
    write_tree(case, {"recipekit.toml": TOML, "recipes/cluster/.keep": ""})
    os.chown(case / "recipekit.toml", 4242, 4242)
    return ["list", "cluster"]


def _search_path_loop(case: Path) -> list[str]:
    write_tree(case, {"recipekit.toml": TOML.replace('["recipes"]', '["loop"]')})
    (case / "loop").symlink_to(case / "loop")
    return ["list", "cluster"]


TEAM_SURFACE = [
    Probe(
        "defaults entry into another folder holding an alias bomb",
        _files(
            {
                "recipe/other.yaml": "# @package _global_\ndefaults:\n  - tiny_sft\n  - /evil/bomb\n  - _self_\n",
                "evil/bomb.yaml": ALIAS_BOMB,
            },
            "show",
            "--recipes",
            "{case}",
            "recipe=other",
        ),
        "alias bomb",
    ),
    Probe(
        "defaults entry leaving the tree",
        _files(
            {"recipe/up.yaml": "# @package _global_\ndefaults:\n  - tiny_sft\n  - ../../../etc/passwd\n  - _self_\n"},
            "show",
            "--recipes",
            "{case}",
            "recipe=up",
        ),
        "leaves the recipe trees",
    ),
    Probe(
        "hydra.searchpath in a layer",
        _files(
            {
                "recipe/sp.yaml": "# @package _global_\ndefaults:\n  - tiny_sft\n  - _self_\nhydra:\n  searchpath: [file:///tmp]\n"
            },
            "show",
            "--recipes",
            "{case}",
            "recipe=sp",
        ),
        "sets a Hydra searchpath",
    ),
    Probe(
        "interpolations doubling at each key",
        _files({"recipe/dbl.yaml": DOUBLING}, "show", "--recipes", "{case}", "recipe=dbl"),
        "would resolve to more than 1 MiB of text",
    ),
    Probe(
        "verify: interpolations doubling at each key",
        _files({"recipe/dbl.yaml": DOUBLING}, "plan", "--recipes", "{case}", "recipe=dbl"),
        "would resolve to more than 1 MiB of text",
    ),
    Probe(
        "TOML bomb in recipekit.toml",
        _files({"recipekit.toml": "a = " + "[" * 30000 + "]" * 30000 + "\n"}, "list", "cluster"),
        "recipekit.toml: nested more than 16 levels deep",
    ),
    Probe(
        "huge recipekit.toml",
        _files({"recipekit.toml": "# " + "x" * 100_000 + "\n" + TOML}, "list", "cluster"),
        "over the limit of 64 KiB (raise it with RECIPEKIT_LIMIT_TOML_KIB=N)",
    ),
    Probe("recipekit.toml of another user", _owned_by_another_user, "owned by uid 4242"),
    Probe("search_path symlink loop", _search_path_loop, "'loop' is a symlink loop"),
]


@surface(TEAM_SURFACE)
def test_team_tree_surface(probe: Probe, tmp_path: Path) -> None:
    if probe.setup is _owned_by_another_user and os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    check_probe(probe, tmp_path)


def test_recipekit_toml_discovery_stops_at_the_repo_root_and_says_what_is_in_force(tmp_path: Path) -> None:
    write_tree(tmp_path, {"recipekit.toml": TOML, "recipes/cluster/planted.yaml": "queue: planted\n"})
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    above = run_measured(["list", "cluster"], repo)
    assert above.code == 0 and "planted" not in above.stdout and "recipekit: using" not in above.stderr
    inside = run_measured(["list", "cluster"], tmp_path / "recipes")
    assert inside.code == 0 and "planted" in inside.stdout
    assert inside.stderr.count(f"recipekit: using {tmp_path / 'recipekit.toml'} (team team)") == 1


def test_origin_detection_runs_no_hook_or_fsmonitor_of_a_layer(tmp_path: Path) -> None:
    """`git status` in a layer would run its core.fsmonitor: the origin is read without running the repo's config."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    layer = tmp_path / "layer"
    write_tree(layer, {"recipes/cluster/team.yaml": "queue: team\n"})
    git = ["git", "-C", str(layer), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    marker = tmp_path / "fsmonitor-ran"
    subprocess.run([*git, "config", "core.fsmonitor", f"touch {marker}; false"], check=True)
    hook = layer / ".git" / "hooks" / "post-index-change"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    (layer / "recipes" / "cluster" / "team.yaml").write_text("queue: edited\n")
    out = tmp_path / "out"
    built = run_measured(["build", "--recipes", str(layer / "recipes"), "recipe=tiny_sft", "-o", str(out)], tmp_path)
    assert built.code == 0, built.stderr
    assert not marker.exists()
    (origin,) = json.loads((out / MANIFEST).read_text())["origin"]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert origin["git_commit"] == head and origin["git_dirty"] is True


# ------------------------------------------------------------------------------------ packages, diff, matrix
def _sparse_package(case: Path) -> list[str]:
    """179 bytes of tar.gz whose sparse entry claims 1.2 GB (GNU tar writes it; Python's tarfile reads it whole)."""
    if shutil.which("tar") is None:
        pytest.skip("GNU tar is not installed")
    (case.parent / "big").write_bytes(b"")
    os.truncate(case.parent / "big", 1_200_000_000)
    subprocess.run(["tar", "--sparse", "-czf", str(case / "p.tar.gz"), "-C", str(case.parent), "big"], check=True)
    return ["verify", "{case}/p.tar.gz"]


def _lying_header(case: Path) -> list[str]:
    """A tar entry whose header claims 100 GB (the data ends after a few bytes)."""
    import gzip
    import io
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("pkg/bundle/README.md")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"abcd"))
    data = bytearray(raw.getvalue())
    data[124:136] = b"\x80" + (100 * 10**9).to_bytes(11, "big")  # GNU base-256 size field
    data[148:156] = b"        "
    data[148:155] = f"{sum(data[:512]):06o}\0".encode()
    (case / "p.tar.gz").write_bytes(gzip.compress(bytes(data)))
    return ["diff", "{case}/p.tar.gz", "{case}/p.tar.gz"]


def _link_to(target: str, command: str) -> Any:
    def setup(case: Path) -> list[str]:
        (case / "p.tar.gz").symlink_to(target)
        return [command, "{case}/p.tar.gz", *(["{case}/p.tar.gz"] if command == "diff" else [])]

    return setup


def _fifo_package(case: Path) -> list[str]:
    os.mkfifo(case / "p.tar.gz")
    return ["verify", "{case}/p.tar.gz"]


def _bundle_with_a_huge_file(case: Path) -> list[str]:
    from recipekit.bundle.build import build

    bundle = build(["recipe=tiny_sft"], case / "a", force=True).path
    shutil.copytree(bundle, case / "b")
    with open(case / "b" / "README.md", "ab") as handle:
        handle.truncate(100 << 20)  # a 100 MiB file: over the bundle-file limit (64 MiB)
    return ["diff", "{case}/a", "{case}/b"]


PACKAGE_SURFACE = [
    Probe("sparse member claiming 1.2 GB", _sparse_package, "sparse files are refused"),
    Probe(
        "member header claiming 100 GB",
        _lying_header,
        "over the limit of 64 MiB (raise it with RECIPEKIT_LIMIT_MEMBER_MIB",
    ),
    Probe("verify: symlink to /dev/zero", _link_to("/dev/zero", "verify"), "is not a regular file"),
    Probe("diff: symlink to /dev/zero", _link_to("/dev/zero", "diff"), "no such bundle directory or package"),
    Probe("verify: a FIFO", _fifo_package, "is not a regular file"),
    Probe("diff: a 100 MiB file in a bundle", _bundle_with_a_huge_file, "RECIPEKIT_LIMIT_BUNDLE_FILE_MIB"),
    Probe(
        "package index nested 100,000 deep",
        lambda case: _package_with(case, "recipekit-package.json", b"[" * 100_000 + b"]" * 100_000),
        "p.tar.gz",
    ),
    Probe(
        "bundle manifest nested 100,000 deep",
        lambda case: _package_with(case, "bundle/manifest.json", b"[" * 100_000 + b"]" * 100_000),
        "p.tar.gz",
    ),
]


def _package_with(case: Path, name: str, content: bytes) -> list[str]:
    """A real package with one entry replaced (its hash then fails, or its parser gives up first)."""
    from recipekit.bundle.build import build
    from recipekit.handover.archive import read_targz, write_targz

    bundle = build(["recipe=tiny_sft"], case.parent / "bundle", force=True).path
    packed = run_measured(["pack", str(bundle), "-o", str(case.parent / "packed")], case.parent)
    assert packed.code == 0, packed.stderr
    (archive,) = (case.parent / "packed").glob("*.tar.gz")
    entries = read_targz(archive.read_bytes(), "package")
    (target,) = [n for n in entries if n.split("/", 1)[1] == name]
    entries[target] = content
    (case / "p.tar.gz").write_bytes(write_targz(entries))
    return ["verify", "{case}/p.tar.gz"]


@surface(PACKAGE_SURFACE)
def test_package_and_diff_surface(probe: Probe, tmp_path: Path) -> None:
    check_probe(probe, tmp_path)


MATRIX_SURFACE = [
    Probe(
        "range(0,10**12)",
        lambda case: ["build", "-m", "recipe=tiny_sft", "train.seed=range(0,1000000000000)", "-o", "{case}/out"],
        "over the limit of 256 bundles (raise it with RECIPEKIT_LIMIT_MATRIX_BUNDLES=N)",
    ),
    Probe(
        "20 × 19 combinations",
        lambda case: [
            "build",
            "-m",
            "recipe=tiny_sft",
            "train.seed=range(0,20)",
            "train.epochs=range(1,20)",
            "-o",
            "{case}/out",
        ],
        "1 × 20 × 19 combinations",
    ),
]


@surface(MATRIX_SURFACE)
def test_matrix_surface(probe: Probe, tmp_path: Path) -> None:
    check_probe(probe, tmp_path)


def test_diff_output_is_bounded_for_huge_files_and_lines(tmp_path: Path) -> None:
    from recipekit.bundle.build import build

    bundle = build(["recipe=tiny_sft"], tmp_path / "a", force=True).path
    shutil.copytree(bundle, tmp_path / "b")
    (tmp_path / "b" / "README.md").write_text("x" * (5 << 20))  # one 5 MiB line: over the 4 MiB line-diff limit
    (tmp_path / "b" / "run.sh").write_text((tmp_path / "a" / "run.sh").read_text() + "# " + "y" * 100_000 + "\n")
    result = run_measured(["diff", str(tmp_path / "a"), str(tmp_path / "b")], tmp_path)
    assert result.code in (0, 1) and "Traceback" not in result.stderr, result.stderr
    assert len(result.stdout) < 20_000 and max(len(line) for line in result.stdout.splitlines()) < 400
    assert "over the line-diff limit of 4 MiB; raise it with RECIPEKIT_LIMIT_DIFF_FILE_MIB=N" in result.stdout
    assert "more characters)" in result.stdout
    assert result.rss_mib < MAX_RSS_MIB


# ---------------------------------------------------------------------------------------------- data, runtime
def _data_bundle(case: Path, name: str, content: bytes, *overrides: str) -> Path:
    """The tiny_sft bundle reading ``name`` (written beside the case directory, on a volume of its own)."""
    from recipekit.bundle.build import build

    volume = case.parent / "volume"
    volume.mkdir(exist_ok=True)
    (volume / name).write_bytes(content)
    settings = [f"data.path={volume / name}", f"cluster.mount_path={volume}", f"cluster.output_dir={volume}/runs"]
    return build(["recipe=tiny_sft", *settings, *overrides], case.parent / "bundle", force=True).path


def _prepare(name: str, content: bytes) -> Any:
    def setup(case: Path) -> list[str]:
        return ["data", "prepare", str(_data_bundle(case, name, content)), "--workers", "1"]

    return setup


def _gz(data: bytes) -> bytes:
    import gzip

    return gzip.compress(data, compresslevel=1)


def _gz_repeated(*parts: tuple[bytes, int], level: int = 9) -> Any:
    """A writer of a gzip holding each part's bytes repeated its count of times, compressed as it is written (a GiB
    of text is never held by the test); at level 9 a GiB of spaces is a 1 MiB file."""

    def write(path: Path) -> None:
        import gzip

        with gzip.open(path, "wb", compresslevel=level) as handle:
            for piece, count in parts:
                block = piece * max(1, (1 << 20) // len(piece))
                whole, rest = divmod(count, max(1, (1 << 20) // len(piece)))
                for _ in range(whole):
                    handle.write(block)
                handle.write(piece * rest)

    return write


def _prepare_written(name: str, write: Any) -> Any:
    def setup(case: Path) -> list[str]:
        bundle = _data_bundle(case, name, b"")
        write(case.parent / "volume" / name)
        return ["data", "prepare", str(bundle), "--workers", "1"]

    return setup


RECORD = b'{"instruction": "a", "output": "b"}'
#: Past the array limit (1024 MiB) only by its whitespace: read whole, as before, it cost more than 1 GB.
SPACES_GZ = _gz_repeated((b"[" + RECORD + b",", 1), (b" ", (1 << 30) + (2 << 20)), (RECORD + b"]", 1))
#: A 420 MB array in a 2 MB gzip, of 1 MiB strings, none a record: the first one ends it (max_bad_records is 0).
#: Read whole, it cost more than 800 MB (its bytes and its text); streamed, one element.
HUGE_ARRAY_GZ = _gz_repeated((b"[", 1), (b'"' + b"x" * (1 << 20) + b'", ', 400), (b"0]", 1), level=1)


LONG_LINE = b'{"instruction": "' + b"a" * (80 << 20) + b'", "output": "b"}\n'
DEEP_LINE = b'{"instruction": ' + b"[" * 100_000 + b"]" * 100_000 + b', "output": "b"}\n'


def _fifo_manifest(case: Path) -> list[str]:
    (case / "prepared").mkdir()
    os.mkfifo(case / "prepared" / "manifest.json")
    return ["data", "verify", "--prepared", "{case}/prepared"]


def _deep_manifest(case: Path) -> list[str]:
    write_tree(case, {"prepared/manifest.json": "[" * 100_000 + "]" * 100_000})
    return ["data", "verify", "--prepared", "{case}/prepared"]


DATA_SURFACE = [
    Probe(
        "1 MiB .jsonl.gz holding one 80 MiB line", _prepare("data.jsonl.gz", _gz(LONG_LINE)), "over the record limit"
    ),
    Probe("plain .jsonl holding one 80 MiB line", _prepare("data.jsonl", LONG_LINE), "over the record limit"),
    Probe(
        "a data line nested 100,000 deep", _prepare("data.jsonl", DEEP_LINE * 3), "JSON nested more than 64 levels deep"
    ),
    Probe(
        "1 MiB .json.gz: an array spread by 1 GiB of spaces",
        _prepare_written("data.json.gz", SPACES_GZ),
        "a JSON array of more than 1024 MiB: over the limit",
        slow=True,
    ),
    Probe(
        "a .json.gz array of 400 MB, none a record",
        _prepare_written("data.json.gz", HUGE_ARRAY_GZ),
        "expected a JSON object, got str",
        slow=True,
    ),
    Probe("a FIFO as manifest.json", _fifo_manifest, "not a regular file"),
    Probe("a prepared manifest nested 100,000 deep", _deep_manifest, "JSON nested more than 64 levels deep"),
]


@surface(DATA_SURFACE)
def test_data_surface(probe: Probe, tmp_path: Path) -> None:
    check_probe(probe, tmp_path)


def test_a_fifo_as_trainer_state_is_an_incomplete_checkpoint_not_a_hang(tmp_path: Path) -> None:
    """What resume reads from the shared volume is opened without blocking: a planted FIFO is refused at once."""
    from recipekit.runtime.boundary import filenames
    from recipekit.runtime.boundary.resume import checkpointdirs, resumechoice

    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    os.mkfifo(checkpoint / filenames.TRAINER_STATE_FILE)
    os.mkfifo(checkpoint / filenames.RUN_FILE)
    assert "not a regular file" in (checkpointdirs.checkpoint_problem(checkpoint) or "")
    assert resumechoice.read_run_record(checkpoint) is None
    assert resumechoice.resume_choice(tmp_path, "r").skipped == (
        ("checkpoint-3", checkpointdirs.checkpoint_problem(checkpoint)),
    )


# ------------------------------------------------------------------------------------------------------ paths
def _option_named_dots(case: Path) -> list[str]:
    write_tree(case, {"team/recipe/...yaml": "# @package _global_\ndefaults:\n  - tiny_sft\n  - _self_\n"})
    return ["build", "-m", "--recipes", "{case}/team", "recipe=glob(*)", "--force", "-o", "{case}/out/root"]


def _data_symlink_outside(case: Path) -> list[str]:
    volume = case.parent / "volume"
    (volume / "data").mkdir(parents=True)
    (case.parent / "secret.jsonl").write_text('{"instruction": "the node\'s secret", "output": "x"}\n')
    (volume / "data" / "a.jsonl").symlink_to(case.parent / "secret.jsonl")
    from recipekit.bundle.build import build

    settings = [f"data.path={volume / 'data'}", f"cluster.mount_path={volume}", f"cluster.output_dir={volume}/runs"]
    bundle = build(["recipe=tiny_sft", *settings], case.parent / "bundle", force=True).path
    return ["data", "prepare", str(bundle), "--workers", "1"]


def _data_glob(spec: str) -> Any:
    def setup(case: Path) -> list[str]:
        from recipekit.bundle.build import build

        volume = case.parent / "volume"
        volume.mkdir()
        settings = [
            f"data.path={volume}/data.jsonl",
            f"cluster.mount_path={volume}",
            f"cluster.output_dir={volume}/runs",
        ]
        bundle = build(["recipe=tiny_sft", *settings], case.parent / "bundle", force=True).path
        # build itself refuses a data.path off the pods' volume; a bundle from elsewhere may still name one, and the
        # prepare step (runtime/data/sources.py) must refuse it too
        doc = yaml.safe_load((bundle / "recipe.yaml").read_text())
        doc["recipe"]["data"]["path"] = spec
        (bundle / "recipe.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        return ["data", "prepare", str(bundle), "--workers", "1", "--volume", str(volume)]

    return setup


PATH_SURFACE = [
    Probe("option file named ...yaml, matrix build with --force", _option_named_dots, "is not an option name"),
    Probe("data.path=/proc/**/*.jsonl", _data_glob("/proc/**/*.jsonl"), "kernel and device files are not training"),
    Probe("data.path=/dev/zero", _data_glob("/dev/zero"), "kernel and device files are not training data"),
    Probe("data-dir symlink to a file outside", _data_symlink_outside, "not followed"),
]


@surface(PATH_SURFACE)
def test_path_surface(probe: Probe, tmp_path: Path) -> None:
    check_probe(probe, tmp_path)
    assert not (tmp_path / "out").exists() and sorted(os.listdir(tmp_path)).count("case") == 1


def test_a_symlink_loop_under_double_star_is_not_followed(tmp_path: Path) -> None:
    """glob's ``**`` follows symlinked directories: two loops made it list 2^depth paths until killed."""
    import time

    from recipekit.runtime.data.sources import find_files

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "up").symlink_to("..")
    (tmp_path / "d" / "self").symlink_to(".")
    (tmp_path / "d" / "x.jsonl").write_text("{}\n")
    started = time.monotonic()
    found = find_files(f"{tmp_path}/**/*.jsonl", "alpaca")
    assert [f.name for f in found] == ["d/x.jsonl"] and time.monotonic() - started < 5


def test_the_metrics_endpoint_binds_where_the_recipe_says(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from types import SimpleNamespace

    from recipekit.runtime.ops.exporter import start_exporter

    result = CliRunner().invoke(main, ["build", "recipe=tiny_sft", "ops.metrics_bind=every", "-o", str(tmp_path / "b")])
    assert result.exit_code == 2 and "ops.metrics_bind: 'every' is not an IP address" in result.output
    exporter = start_exporter(SimpleNamespace(ports=[0], ranks="all", bind="127.0.0.1"), "job", 0, 0)
    try:
        assert exporter.server[0].server_address[0] == "127.0.0.1"
    finally:
        exporter.close()


# ------------------------------------------------------------------------- image build, plan --data, small inputs
def _bundle_copy(case: Path, recipe_yaml: bytes | None = None) -> Path:
    from recipekit.bundle.build import build

    bundle = build(["recipe=tiny_sft"], case / "b", force=True).path
    if recipe_yaml is not None:
        (bundle / "recipe.yaml").write_bytes(recipe_yaml)
    return bundle


def _with_recipe_yaml(content: bytes, *command: str) -> Any:
    def setup(case: Path) -> list[str]:
        return [*command, str(_bundle_copy(case, content))]

    return setup


def _engine(url: str) -> Any:
    def setup(case: Path) -> list[str]:
        return ["image", "build", str(_bundle_copy(case)), "--engine", url]

    return setup


def _counts(case: Path) -> list[str]:
    counts = {"format": "recipekit-prepared", "version": 1, "splits": {"train": {"rows": "many", "tokens": "x"}}}
    (case / "m.json").write_text(json.dumps(counts))
    return ["plan", "recipe=tiny_sft", "--data", "{case}/m.json"]


DEEP_YAML = b"x: " + b"[" * 100_000 + b"]" * 100_000 + b"\n"
SMALL_INPUTS = [
    Probe("plan --data with non-numeric counts", _counts, "rows and tokens are 'many' and 'x', not counts"),
    Probe("image build: malformed recipe.yaml", _with_recipe_yaml(b"garbage: [\n", "image", "build"), "not valid YAML"),
    Probe("image build: --engine 'tcp://[::1'", _engine("tcp://[::1"), "Invalid IPv6 URL"),
    Probe("data prepare: non-UTF-8 recipe.yaml", _with_recipe_yaml(b"name: caf\xe9\n", "data", "prepare"), "not UTF-8"),
    Probe("data prepare: recipe.yaml nested 100,000 deep", _with_recipe_yaml(DEEP_YAML, "data", "prepare"), "nesting"),
    Probe("data verify: recipe.yaml nested 100,000 deep", _with_recipe_yaml(DEEP_YAML, "data", "verify"), "nesting"),
]


@surface(SMALL_INPUTS)
def test_small_inputs_surface(probe: Probe, tmp_path: Path) -> None:
    check_probe(probe, tmp_path)
