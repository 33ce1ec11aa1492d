"""Names Kubernetes and Volcano accept, made from recipe names: one spelling for the plan, its documents, the
templates and validate.
"""

from __future__ import annotations

import re

from recipekit.recipe.domains import DNS_LABEL

#: The length limit of a Kubernetes object name (an RFC 1123 label).
MAX_DNS_LABEL = 63


def is_dns_label(text: str) -> bool:
    """Whether Kubernetes accepts ``text`` as a DNS-1123 label (the schema's own domain, full match)."""
    return DNS_LABEL.problem(text) is None


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
