"""What a bundle's pods trust, said in ``validate``: the run key that proves which checkpoints this run wrote.

The Job must mount the run-key Secret read-only where launch.json's ``RECIPEKIT_RUN_KEY_FILE`` points: without it
train.py saves unsigned checkpoints and refuses every resume (runtime/session/checkpoints.py, docs/trust.md). A
hand-edited Job that dropped the mount is a failure here rather than a surprise at the first restart. The passing line
says what remains trusted.
"""

from __future__ import annotations

from typing import Any

from recipekit.bundle.files import JOB, LAUNCH
from recipekit.runtime.volume import trust
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Result


def check_trust(bundle: Bundle) -> Result:
    result = Result("trust.run-key", "the Job mounts the run key: only checkpoints and data this run signed are used")
    if bundle.job is None or bundle.launch is None:
        return result.skip(f"{JOB} or {LAUNCH} missing or unparseable")
    wanted = (bundle.launch.get("env") or {}).get(trust.KEY_ENV)
    if wanted != f"{trust.KEY_MOUNT}/{trust.KEY_NAME}":
        result.fail(LAUNCH, f"env.{trust.KEY_ENV}", f"is {wanted!r}, not {trust.KEY_MOUNT}/{trust.KEY_NAME}")
    for index, task in enumerate((bundle.job.get("spec") or {}).get("tasks") or []):
        where = f"spec.tasks[{index}].template.spec"
        problem = _mount_problem(((task or {}).get("template") or {}).get("spec") or {})
        if problem:
            result.fail(JOB, where, problem, f"mount Secret {trust.SECRET_NAME} read-only at {trust.KEY_MOUNT}")
    if not result.failed:
        namespace = ((bundle.job.get("metadata") or {}).get("namespace")) or "default"
        result.reason = (
            f"Secret {trust.SECRET_NAME} (namespace {namespace}) signs checkpoints and prepared data; still trusted: "
            "the image, the bundle, whoever can read the Secret (docs/trust.md)"
        )
    return result


def _mount_problem(spec: dict[str, Any]) -> str | None:
    volumes = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    secret_volumes = {
        name for name, v in volumes.items() if (v.get("secret") or {}).get("secretName") == trust.SECRET_NAME
    }
    if not secret_volumes:
        return f"no volume from Secret {trust.SECRET_NAME}"
    for container in spec.get("containers") or []:
        for mount in (container or {}).get("volumeMounts") or []:
            if mount.get("name") in secret_volumes and mount.get("mountPath") == trust.KEY_MOUNT:
                return None if mount.get("readOnly") else f"the run key is mounted writable at {trust.KEY_MOUNT}"
    return f"the Secret {trust.SECRET_NAME} is not mounted at {trust.KEY_MOUNT}"
