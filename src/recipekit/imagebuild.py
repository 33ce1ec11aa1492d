"""Build a bundle's image through any Docker-API engine, push it, and pin the bundle's Job to what was pushed.

``recipekit image build`` talks to the engine with the ``docker`` SDK (the ``image`` extra), so Docker, Podman's
``podman system service`` or a remote engine all work the same way. The request is checked before the engine is
contacted: the platform must be the nodes' (``hw.arch``), every ``--build-arg`` must be an ARG the Dockerfile
declares. The build is streamed step by step; a failing step is reported with its last lines. After a push the
registry's manifest digest is what the Job runs (``name@sha256:...``): a tag can be moved, a digest cannot. The
bundle is rewritten whole and atomically, with manifest.json's hashes kept right, so ``recipekit validate`` still
passes on it.

The docker SDK is imported only here, only when the command runs: ``recipekit build`` never loads it.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recipekit.bundle import is_bundle, write_bundle
from recipekit.bundlefiles import read_files
from recipekit.dockerfile import PLATFORM_ARGS, PREDEFINED_ARGS, parse, split_image
from recipekit.errors import Problem, RecipeError
from recipekit.render import MANIFEST

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
    if not bundle.is_dir() or not is_bundle(bundle):
        raise RecipeError([Problem(str(bundle), "not a recipekit bundle (no manifest.json)", "recipekit build ...")])
    dockerfile = bundle / "Dockerfile"
    if not dockerfile.is_file():
        raise RecipeError([Problem(str(dockerfile), "missing: the bundle has no Dockerfile")])
    declared, doc = _bundle_inputs(bundle)
    arch = ((doc.get("recipe") or {}).get("hw") or {}).get("arch")
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
    reference = tag or (doc.get("plan") or {}).get("image")
    if not reference:
        problems.append(Problem("--tag", "recipe.yaml has no plan.image: give the image reference"))
    if problems:
        raise RecipeError(problems)
    return BuildRequest(bundle.resolve(), str(reference), chosen, args, push, engine)


def _bundle_inputs(bundle: Path) -> tuple[Any, dict[str, Any]]:
    """The Dockerfile's declared ARGs and recipe.yaml, read safely: a malformed bundle is a one-line RecipeError."""
    from recipekit import yamlfile

    try:
        declared = parse(dockerfile_text(bundle)).args
        doc = yamlfile.read(bundle / "recipe.yaml")
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, yaml.YAMLError, yamlfile.UnsafeYAML) as exc:
        message = getattr(exc, "message", None) or " ".join(str(exc).split())[:200]
        raise RecipeError([Problem(str(bundle), f"not a usable bundle: {message}", "rebuild it")]) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("recipe") or {}, dict):
        raise RecipeError([Problem(str(bundle / "recipe.yaml"), "not a recipekit recipe.yaml", "rebuild the bundle")])
    return declared, doc


def dockerfile_text(bundle: Path) -> str:
    from recipekit.limits import BUNDLE_FILE, read_regular

    return read_regular(bundle / "Dockerfile", BUNDLE_FILE).decode("utf-8")


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
    where = req.engine or "the environment's engine (DOCKER_HOST, else /var/run/docker.sock)"
    try:
        client = docker.DockerClient(base_url=req.engine, timeout=600) if req.engine else docker.from_env(timeout=600)
        client.ping()
    except (DockerException, OSError, ValueError) as exc:  # ValueError: a malformed URL ('tcp://[::1')
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise RecipeError(
            [Problem("engine", f"no Docker-API engine reachable at {where}: {reason}", hint=equivalent)]
        ) from None
    return client


def build(client: Any, req: BuildRequest, echo: Callable[[str], None]) -> Built:
    """Build, streaming each step to ``echo``; :class:`BuildFailed` names the failing step and its last lines."""
    step, tail = "", deque(maxlen=TAIL_LINES)
    image_id = ""
    try:
        events = client.api.build(
            path=str(req.bundle),
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
            found = aux.get("Digest") or (_DIGEST.search(status).group(1) if "digest" in status else None)
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

    The whole bundle is rewritten atomically (:func:`recipekit.bundle.write_bundle`), with manifest.json's hash
    of the Job updated, so the bundle stays one that ``recipekit validate`` accepts.
    """
    files = read_files(Path(bundle))[0]
    manifest = json.loads(files[MANIFEST])
    if built.pinned:
        files[JOB] = pin_job(files[JOB].decode("utf-8"), built.pinned).encode("utf-8")
    manifest["image"] = {
        "reference": built.reference,
        "platform": built.platform,
        "id": built.image_id,
        "digest": built.digest,
        "pinned": built.pinned,
    }
    listed = manifest.get("files") or {}
    manifest["files"] = {name: hashlib.sha256(files[name]).hexdigest() for name in sorted(listed) if name in files}
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
