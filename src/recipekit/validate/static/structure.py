"""Checks of the bundle as files and as a Volcano Job: everything parses, nothing was edited since the build, and
the Job is one the cluster's API server and Volcano's admission webhook accept.

The Job rules themselves (CRD schema, webhook, pod template) live in :mod:`recipekit.validate.static.volcano`; these
checks turn their findings into results.
"""

from __future__ import annotations

import hashlib

from recipekit.bundle.files import DS_CONFIG as DS
from recipekit.bundle.files import JOB, MANIFEST, REQUIRED
from recipekit.validate.shared import controller
from recipekit.validate.shared.loader import Bundle
from recipekit.validate.shared.results import Result, Status
from recipekit.validate.static import volcano


def check_parse(bundle: Bundle) -> Result:
    result = Result("files.parse", "every file parses (YAML, JSON, recipe.yaml structure, bash -n, Dockerfile)")
    result.fail_all(bundle.parse_findings)
    if result.status is Status.PASS:
        result.reason = f"{len(bundle.raw)} files"
    return result


def check_manifest(bundle: Bundle) -> Result:
    result = Result("files.manifest", "manifest.json hashes match; no missing or extra files")
    listed: dict[str, str] = bundle.manifest["files"]
    for name, digest in sorted(listed.items()):
        data = bundle.raw.get(name)
        if data is None:
            result.fail(name, "", "missing: listed in manifest.json but not in the bundle")
        elif hashlib.sha256(data).hexdigest() != digest:
            result.fail(
                name,
                "",
                "edited after the build: its sha256 differs from manifest.json's",
                hint="change the recipe and rebuild instead of editing bundle files",
            )
    for name in sorted(set(bundle.raw) - set(listed) - {MANIFEST}) + bundle.extra_entries:
        result.fail(name, "", "extra file: not listed in manifest.json", hint="remove it, or rebuild the bundle")
    for name in REQUIRED:
        if name not in listed and name not in bundle.raw:
            result.fail(name, "", "missing: every bundle has it")
    if bundle.plan.get("zero_stage") and DS not in bundle.raw:
        result.fail(DS, "", f"missing, but recipe.yaml plan.zero_stage is {bundle.plan.get('zero_stage')}")
    if result.status is Status.PASS:
        result.reason = f"{len(listed)} files match their hashes"
    return result


def check_job_schema(bundle: Bundle) -> Result:
    result = Result("volcano.schema", "Volcano Job: only fields batch.volcano.sh/v1alpha1 defines, right types")
    if bundle.job is None:
        return result.skip(f"{JOB} missing or unparseable")
    result.fail_all(volcano.schema_findings(bundle.job))
    if result.status is Status.PASS:
        result.reason = "every field defined by the Job type, with its type"
    return result


def check_job_webhook(bundle: Bundle) -> Result:
    result = Result("volcano.webhook", "Volcano Job: admission webhook rules (tasks, minAvailable, policies, names)")
    if bundle.job is None:
        return result.skip(f"{JOB} missing or unparseable")
    result.fail_all(volcano.webhook_findings(bundle.job))
    result.fail_all(controller.unreachable_policy_findings(bundle.job))
    result.fail_all(controller.contract_policy_findings(bundle.job, controller.nonfinite_mode(bundle.doc)))
    result.reason = "queue existence and state need a cluster: not checked" if result.status is Status.PASS else ""
    return result


def check_pod_template(bundle: Bundle) -> Result:
    result = Result(
        "volcano.pod-template",
        f"pod template: a valid v1 PodTemplate (Kubernetes {volcano.KUBERNETES_VERSION} schema, strict)",
    )
    if bundle.job is None:
        return result.skip(f"{JOB} missing or unparseable")
    findings = volcano.pod_template_findings(bundle.job)
    if isinstance(findings, str):
        return result.skip(findings)
    result.fail_all(findings)
    if result.status is Status.PASS:
        result.reason = "valid v1 PodTemplate; mounts name declared volumes; device requests = limits"
    return result
