"""Names Kubernetes and Volcano accept, made from recipe names: one spelling for the plan, its documents, the
templates and validate.
"""

from __future__ import annotations

import re

#: A Kubernetes object name (RFC 1123 label) and its length limit.
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_DNS_LABEL = 63


def k8s_name(text: str, limit: int = MAX_DNS_LABEL) -> str:
    """Make ``text`` a DNS label: lower case, ``[a-z0-9-]``, at most ``limit`` characters, no dash at either end."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[:limit].strip("-")
    return name or "recipe"


def task_env_name(task: str) -> str:
    """Volcano's svc plugin names env vars after the task: upper case, ``-`` → ``_``."""
    return task.replace("-", "_").upper()


def host_volume_name(path: str) -> str:
    """The Job's volume name for a host path (a DNS label derived from the path)."""
    return k8s_name("host-" + path.strip("/").replace("/", "-").replace("_", "-").replace(".", "-"))
