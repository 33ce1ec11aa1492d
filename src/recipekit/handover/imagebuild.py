"""Build a bundle's image through any Docker-API engine, push it, and pin the bundle's Job to what was pushed.

``recipekit image build`` talks to the engine with the ``docker`` SDK (the ``image`` extra), so Docker, Podman's
``podman system service`` or a remote engine all work the same way. The request is checked before the engine is
contacted: the build context (the Dockerfile and the runtime it copies) must be the one manifest.json lists and the
tag names (handover/buildcontext.py: an edited bundle is never built under its stack's shared tag), the platform
must be the nodes' (``hw.arch``), every ``--build-arg`` must be an ARG the Dockerfile declares. The engine gets a tar
of exactly the bytes checked. The build is streamed step by step; a failing step is reported with its last lines.
After a push the registry's manifest digest is what the Job runs (``name@sha256:...``): a tag can be moved, a digest
cannot. What is recorded changes the Job and manifest.json's ``image`` and the Job's hash only, after every other
file was checked against its listed hash again: manifest.json is never re-hashed from files this command did not
write, so ``recipekit validate`` still catches an edit made before or during the build.

The docker SDK is imported only here, only when the command runs: ``recipekit build`` never loads it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import shutil
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipekit.base import yamlfile
from recipekit.base.errors import Problem, RecipeError
from recipekit.base.limits import BUNDLE_FILE, read_regular
from recipekit.base.paths import did_you_mean
from recipekit.bundle.files import read_files
from recipekit.bundle.render import MANIFEST
from recipekit.bundle.write import manifest_problem, write_bundle
from recipekit.handover.buildcontext import BuildContext, checked_context
from recipekit.image.dockerfile import PLATFORM_ARGS, PREDEFINED_ARGS, parse, split_image
from recipekit.runtime.boundary import jsonfile

JOB = "volcano-job.yaml"
#: Lines of a failing step shown with the error.
TAIL_LINES = 25
_STEP = re.compile(r"^(?:STEP|Step) (\d+)/(\d+) ?: ?(.*)$")
_DIGEST = re.compile(r"(sha256:[0-9a-f]{64})")


@dataclass(frozen=True)
class BuildRequest:
    """A checked request: what to build, for which platform, with which build args, and where it goes."""

    bundle: Path
    tag: str
    platform: str
    build_args: dict[str, str]
    push: bool
    engine: str | None
    #: the checked build context: what the engine is sent, and the stack digest it was recomputed as
    context: BuildContext

    def docker_command(self) -> str:
        """The same build as plain docker commands (for a machine without an engine recipekit can reach)."""
        words = ["docker", "build", "--platform", self.platform]
        for key, value in self.build_args.items():
            words += ["--build-arg", f"{key}={value}"]
        words += ["-t", self.tag, str(self.bundle)]
        command = shlex.join(words)
        return command + (f" && docker push {shlex.quote(self.tag)}" if self.push else "")


@dataclass
class BuildFailed(Exception):
    """The engine refused the build (or push): the step it was at, its last lines and the engine's message."""

    message: str
    step: str = ""
    tail: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Built:
    reference: str
    image_id: str
    platform: str
    digest: str | None = None  # the registry's manifest digest, after a push

    @property
    def pinned(self) -> str | None:
        return f"{split_image(self.reference)[0]}@{self.digest}" if self.digest else None


def request(
    bundle: Path,
    *,
    tag: str | None = None,
    platform: str | None = None,
    build_args: Iterable[str] = (),
    push: bool = False,
    engine: str | None = None,
) -> BuildRequest:
    """Check the request against the bundle; raise RecipeError with every problem (exit 2)."""
    bundle = Path(bundle)
    problems: list[Problem] = []
    unusable = manifest_problem(bundle) if bundle.is_dir() else "not a directory"
    if not bundle.exists():
        unusable = "no such directory" + did_you_mean(bundle)
    if unusable:
        raise RecipeError([Problem(str(bundle), f"not a recipekit bundle ({unusable})", "recipekit build ...")])
    dockerfile = bundle / "Dockerfile"
    if not dockerfile.is_file():
        raise RecipeError([Problem(str(dockerfile), "missing: the bundle has no Dockerfile")])
    arch, image = _recipe_facts(bundle / "recipe.yaml")
    manifest = jsonfile.loads(read_regular(bundle / MANIFEST, BUNDLE_FILE), str(bundle / MANIFEST))  # checked above
    context = checked_context(bundle, manifest, image, tag)
    try:
        declared = parse(context.dockerfile.decode("utf-8")).args
    except UnicodeDecodeError as exc:
        raise RecipeError([Problem(str(dockerfile), f"is not UTF-8 text (byte offset {exc.start})")]) from None
    nodes = f"linux/{arch}" if arch else None
    chosen = platform or nodes or "linux/amd64"
    if nodes and chosen != nodes:
        problems.append(
            Problem(
                "--platform",
                f"{chosen}, but the Job runs on {nodes} nodes (hw.arch={arch}): the pods would fail with "
                "'exec format error'",
                hint=f"leave --platform out, or rebuild the bundle with hw.arch={chosen.split('/')[-1]}",
            )
        )
    args: dict[str, str] = {}
    for item in build_args:
        key, sep, value = item.partition("=")
        if not sep or not key:
            problems.append(Problem("--build-arg", f"{item!r} is not KEY=VALUE"))
        elif key in PLATFORM_ARGS:
            problems.append(Problem(f"--build-arg {key}", "is set by the builder from --platform", hint="--platform"))
        elif key not in declared and key not in PREDEFINED_ARGS:
            problems.append(
                Problem(
                    f"--build-arg {key}",
                    "the Dockerfile declares no such ARG",
                    hint="declared: " + ", ".join(k for k in declared if k not in PLATFORM_ARGS),
                )
            )
        else:
            args[key] = value
    reference = tag or image
    if not reference:
        problems.append(Problem("--tag", "recipe.yaml has no plan.image: give the image reference"))
    if problems:
        raise RecipeError(problems)
    return BuildRequest(bundle.resolve(), str(reference), chosen, args, push, engine, context)


def _recipe_facts(path: Path) -> tuple[str | None, str | None]:
    """``recipe.hw.arch`` and ``plan.image`` from a bundle's recipe.yaml, read as untrusted YAML (a malformed bundle
    is one line naming the file, not a traceback)."""
    try:
        doc = yamlfile.read(path)
    except yamlfile.UnsafeYAML as exc:
        raise RecipeError([Problem(f"{exc.source}{f':{exc.line}' if exc.line else ''}", exc.message)]) from None
    except yaml.YAMLError as exc:
        raise RecipeError([Problem(str(path), f"not valid YAML: {yamlfile.one_line(exc)}")]) from None
    doc = doc if doc is not None else {}
    recipe = doc.get("recipe") if isinstance(doc, dict) else None
    hw = recipe.get("hw") if isinstance(recipe, dict) else None
    plan = doc.get("plan") if isinstance(doc, dict) else None
    arch = hw.get("arch") if isinstance(hw, dict) else None
    image = plan.get("image") if isinstance(plan, dict) else None
    if not isinstance(doc, dict) or any(v is not None and not isinstance(v, dict) for v in (recipe, hw, plan)):
        raise RecipeError([Problem(str(path), "not a recipekit recipe.yaml (recipe, recipe.hw and plan are mappings)")])
    if arch is not None and not (isinstance(arch, str) and re.fullmatch(r"[a-z0-9_]{1,32}", arch)):
        raise RecipeError([Problem(f"{path}: recipe.hw.arch", f"{arch!r:.60} is not an architecture name")])
    if image is not None and not isinstance(image, str):
        raise RecipeError([Problem(f"{path}: plan.image", f"{image!r:.60} is not an image reference")])
    return arch or None, image or None


def connect(req: BuildRequest) -> Any:
    """A docker SDK client for the engine, checked with a ping; RecipeError with the docker command otherwise."""
    equivalent = f"run the same build elsewhere: {req.docker_command()}"
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        raise RecipeError(
            [Problem("engine", "the docker SDK is not installed (pip install 'recipekit[image]')", hint=equivalent)]
        ) from None
    where = (req.engine or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock").removeprefix("unix://")
    try:
        client = docker.DockerClient(base_url=req.engine, timeout=600) if req.engine else docker.from_env(timeout=600)
        client.ping()
    except (DockerException, OSError, ValueError) as exc:  # ValueError: an engine URL urllib cannot parse
        raise RecipeError(
            [Problem("engine", f"no Docker-API engine reachable: {engine_reason(exc, where)}", hint=_hint(equivalent))]
        ) from None
    return client


def engine_reason(exc: BaseException, where: str) -> str:
    """Why the engine did not answer, in words: the socket is missing, refuses, or is not ours to open; else the
    error's first line. The docker SDK wraps the cause in requests' and urllib3's tuples
    (``('Connection aborted.', FileNotFoundError(2, ...))``), which say nothing to a user."""
    seen: set[int] = set()
    pending: list[object] = [exc]
    while pending:
        current = pending.pop(0)
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, FileNotFoundError):
            return f"no socket at {where}"
        if isinstance(current, ConnectionRefusedError):
            return f"{where} refuses connections (is the engine running?)"
        if isinstance(current, PermissionError):
            return f"permission denied on {where}"
        pending += [*current.args, current.__cause__, current.__context__]
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{where}: {first[:200]}"


def _hint(equivalent: str) -> str:
    """Where podman is installed, how to start its Docker-API service; then the docker command to run elsewhere."""
    if shutil.which("podman"):
        socket = "unix:///tmp/podman.sock"
        start = f"podman system service --time=0 {socket} &"
        return f"podman is installed: start its engine with `{start}`, then --engine {socket}; or {equivalent}"
    return equivalent


def already_built(client: Any, req: BuildRequest) -> Built | None:
    """The image ``req.tag`` names, when the engine (or, for a push, the registry) already holds it for the nodes'
    platform; None when it must be built.

    The tag is a digest of the software stack (image/stack.py), so an existing tag is this stack already built: a
    second bundle of it (another learning rate, a rescale) builds nothing. That holds only for the stack digest
    recomputed from this bundle's checked context: any other tag (``--tag ...:v1``) may hold anything, so it is
    built. For a push the registry is asked first (its manifest digest is what the Job is pinned to); an image only
    the engine has is pushed, not rebuilt. Any engine error counts as not found: the build then says what is wrong.
    """
    if split_image(req.tag)[1] != req.context.stack:
        return None
    if req.push:
        try:
            found = client.api.inspect_distribution(req.tag)
        except Exception:  # noqa: BLE001 - not in the registry, or an engine without the distribution endpoint
            found = None
        descriptor = found.get("Descriptor") if isinstance(found, dict) else None
        digest = descriptor.get("digest") if isinstance(descriptor, dict) else None
        platforms = {f"{p.get('os')}/{p.get('architecture')}" for p in (found or {}).get("Platforms") or []}
        if isinstance(digest, str) and _DIGEST.fullmatch(digest) and (not platforms or req.platform in platforms):
            return Built(req.tag, "", req.platform, digest)
    try:
        attrs = client.api.inspect_image(req.tag)
    except Exception:  # noqa: BLE001 - the SDK's ImageNotFound and connection errors alike
        return None
    if not isinstance(attrs, dict) or f"{attrs.get('Os', 'linux')}/{attrs.get('Architecture', '?')}" != req.platform:
        return None
    return Built(req.tag, str(attrs.get("Id", "")), req.platform)


def carry_pin(source: Path, target: Path) -> str | None:
    """Pin ``target`` (a rebuild of ``source``: a rescale) to the image ``source`` was pushed as, when both name the
    same image; return the pinned reference, or None when ``source`` was never pushed or names another image."""
    try:
        manifest = jsonfile.loads(read_regular(Path(source) / MANIFEST, BUNDLE_FILE), str(Path(source) / MANIFEST))
    except (OSError, ValueError):
        return None
    image = manifest.get("image") if isinstance(manifest, dict) else None
    if not isinstance(image, dict) or not image.get("pinned") or not image.get("digest"):
        return None
    if image.get("reference") != _recipe_facts(Path(target) / "recipe.yaml")[1]:
        return None
    built = Built(
        str(image["reference"]), str(image.get("id") or ""), str(image.get("platform") or ""), image["digest"]
    )
    record(target, built)
    return built.pinned


def build(client: Any, req: BuildRequest, echo: Callable[[str], None]) -> Built:
    """Build, streaming each step to ``echo``; :class:`BuildFailed` names the failing step and its last lines."""
    step, tail = "", deque[str](maxlen=TAIL_LINES)
    image_id = ""
    try:
        events = client.api.build(
            fileobj=io.BytesIO(req.context.tar()),  # the checked bytes, not a second read of the directory
            custom_context=True,
            tag=req.tag,
            buildargs=req.build_args,
            platform=req.platform,
            decode=True,
            rm=True,
            forcerm=True,
        )
        for event in events:
            if "error" in event or "errorDetail" in event:
                message = (event.get("errorDetail") or {}).get("message") or event.get("error") or "build failed"
                raise BuildFailed(message.strip(), step, list(tail))
            if isinstance(event.get("aux"), dict) and event["aux"].get("ID"):
                image_id = event["aux"]["ID"]
            for line in str(event.get("stream", "")).splitlines():
                match = _STEP.match(line.strip())
                if match:
                    step, tail = line.strip(), deque(maxlen=TAIL_LINES)
                elif line.strip():
                    tail.append(line.rstrip())
                echo(line.rstrip())
    except BuildFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - the SDK's API and connection errors, reported as the build's failure
        raise BuildFailed(f"{type(exc).__name__}: {exc}", step, list(tail)) from None
    attrs = client.api.inspect_image(req.tag)
    image_id = image_id or attrs.get("Id", "")
    built_for = f"{attrs.get('Os', 'linux')}/{attrs.get('Architecture', '?')}"
    if built_for != req.platform:
        raise BuildFailed(f"the engine built {built_for}, not {req.platform}: the nodes could not run it")
    return Built(req.tag, image_id, req.platform)


def push(client: Any, req: BuildRequest, built: Built, echo: Callable[[str], None]) -> Built:
    """Push, and return the build with the registry's manifest digest (from the push's own report)."""
    repository, tag = split_image(req.tag)
    digest = None
    last: deque[str] = deque(maxlen=TAIL_LINES)
    try:
        for event in client.api.push(repository, tag=tag, stream=True, decode=True):
            if "error" in event or "errorDetail" in event:
                message = (event.get("errorDetail") or {}).get("message") or event.get("error") or "push failed"
                raise BuildFailed(message.strip(), f"push {req.tag}", list(last))
            aux = event.get("aux") if isinstance(event.get("aux"), dict) else {}
            status = str(event.get("status", ""))
            match = _DIGEST.search(status) if "digest" in status else None
            found = aux.get("Digest") or (match.group(1) if match else None)
            digest = found or digest
            if status and not event.get("progressDetail"):
                last.append(status)
                echo(status)
    except BuildFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - as in build()
        raise BuildFailed(f"{type(exc).__name__}: {exc}", f"push {req.tag}", list(last)) from None
    if digest is None:
        raise BuildFailed(f"the engine pushed {req.tag} but reported no digest", f"push {req.tag}", list(last))
    return Built(built.reference, built.image_id, built.platform, digest)


def record(bundle: Path, built: Built) -> Path:
    """Write what was built into the bundle: manifest.json's ``image`` and, once pushed, the Job's image by digest.

    Every file manifest.json lists must still hash as listed (the Job included, before it is pinned): this command
    writes the Job and the manifest's ``image`` and the Job's hash, and never re-hashes a file it did not write, so
    an edit made before or during the build stays one ``recipekit validate`` reports (RecipeError naming the file,
    nothing written). The bundle is rewritten atomically (:func:`recipekit.bundle.write.write_bundle`).
    """
    files = read_files(Path(bundle))[0]
    manifest = jsonfile.loads(files[MANIFEST], str(Path(bundle) / MANIFEST))  # request() checked it before
    listed = dict(manifest.get("files") or {})
    for name, digest in listed.items():
        if name not in files or hashlib.sha256(files[name]).hexdigest() != digest:
            raise RecipeError(
                [
                    Problem(
                        str(Path(bundle) / name),
                        "differs from manifest.json's hash: the bundle changed before or during the build, and "
                        "nothing was recorded",
                        hint="rebuild the bundle with `recipekit build`, then build its image",
                    )
                ]
            )
    if built.pinned:
        files[JOB] = pin_job(files[JOB].decode("utf-8"), built.pinned).encode("utf-8")
        listed[JOB] = hashlib.sha256(files[JOB]).hexdigest()
    manifest["image"] = {
        "reference": built.reference,
        "platform": built.platform,
        "id": built.image_id,
        "digest": built.digest,
        "pinned": built.pinned,
    }
    manifest["files"] = listed
    files[MANIFEST] = (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    return write_bundle(files, Path(bundle), force=True)


def pin_job(text: str, pinned: str) -> str:
    """The Job with every container image replaced by ``pinned``; only those lines change."""
    job = yaml.safe_load(text)
    images = {
        container.get("image")
        for task in (job.get("spec") or {}).get("tasks") or []
        for container in ((task.get("template") or {}).get("spec") or {}).get("containers") or []
    }
    for image in sorted(i for i in images if i):
        text, count = re.subn(rf"^(\s*-?\s*image: ){re.escape(image)}$", rf"\g<1>{pinned}", text, flags=re.MULTILINE)
        if not count:
            raise RecipeError([Problem(JOB, f"cannot find the line 'image: {image}' to pin it")])
    return text
