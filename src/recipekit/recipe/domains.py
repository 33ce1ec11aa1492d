"""What each recipe string may be: Kubernetes names as the API server validates them, paths, image references, NICs.

A recipe value lands in several parsers at once — the Kubernetes API server, Volcano's admission webhook, a
container runtime, a process environment, the commands a README tells a person to paste — and each reads it by its
own rules. A value outside its domain would either be rejected there, long after the build said "built" (an upper
case namespace, a 64-character PVC name, ``/dev/shm`` as the PVC mount), or be read as something else (an env var
name ``A=$(...)``, a path with ``..``). So each domain here is the rule of the system that finally reads the value,
checked at build time with the key named. The Kubernetes rules are those of ``k8s.io/apimachinery``'s
``validation`` package (``IsDNS1123Label``, ``IsDNS1123Subdomain``, ``IsQualifiedName``, ``IsValidLabelValue``) and
``IsExtendedResourceName``; image references follow the grammar of ``distribution/reference``.

Every domain rejects what the schema already rejects in all text (control characters, newlines); the domains below
are the stricter rules of particular fields.
"""

from __future__ import annotations

import posixpath
import re

from recipekit.recipe.schema import Domain, pattern_domain
from recipekit.runtime.boundary.filenames import POD_WORKDIR

_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"

#: Namespaces, Volcano task names (pod host names): ``IsDNS1123Label``.
DNS_LABEL = pattern_domain(
    "DNS-1123 label",
    "at most 63 characters: lower-case letters, digits and '-', starting and ending with a letter or digit",
    _LABEL,
    max_length=63,
)

#: PersistentVolumeClaims, PriorityClasses, Volcano queues (cluster-scoped custom objects): ``IsDNS1123Subdomain``.
DNS_SUBDOMAIN = pattern_domain(
    "DNS-1123 subdomain",
    "at most 253 characters: dot-separated DNS labels of lower-case letters, digits and '-'",
    rf"{_LABEL}(?:\.{_LABEL})*",
    max_length=253,
)

#: Environment variable names: C identifiers, what every shell and ``os.environ`` consumer can export.
ENV_NAME = pattern_domain(
    "environment variable name",
    "a C identifier: letters, digits and '_', not starting with a digit, at most 128 characters",
    r"[A-Za-z_][A-Za-z0-9_]*",
    max_length=128,
)

#: Short names of options (model, hardware, parallel, data, cluster): they appear in bundle, image and job names.
SHORT_NAME = pattern_domain(
    "short name",
    "at most 63 letters, digits, '.', '_' and '-', starting and ending with a letter or digit",
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?",
    max_length=63,
)

#: Module names PEFT adapts (``q_proj``, ``model.layers.0.mlp``).
MODULE_NAME = pattern_domain(
    "module name",
    "letters, digits, '_', '.' and '-', at most 200 characters",
    r"[A-Za-z0-9_.-]+",
    max_length=200,
)

#: A model's name_or_path and a data path: any one line of text (a path on the volume or a hub id), not empty.
LOCATION = pattern_domain(
    "path or hub id", "one non-empty line of text, at most 4096 characters", r".+", max_length=4096
)

_QUALIFIED_PART = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"


def _qualified_name(value: str, *, prefix_required: bool) -> str | None:
    """``IsQualifiedName``: ``[prefix/]name``, prefix a DNS-1123 subdomain, name at most 63 characters."""
    prefix, slash, name = value.rpartition("/")
    if not slash and prefix_required:
        return "has no 'domain/' prefix"
    if slash:
        if not prefix:
            return "has an empty prefix before '/'"
        wrong = DNS_SUBDOMAIN.problem(prefix)
        if wrong is not None:
            return f"prefix {prefix!r} {wrong}"
    if not name:
        return "has an empty name"
    if len(name) > 63:
        return f"name part is {len(name)} characters long (at most 63)"
    if not re.fullmatch(_QUALIFIED_PART, name):
        return f"name part {name!r} has characters other than letters, digits, '-', '_', '.' at its ends or inside"
    return None


#: Kubernetes label and nodeSelector keys: ``IsQualifiedName``.
LABEL_KEY = Domain(
    "Kubernetes label key",
    "[prefix/]name: prefix a DNS-1123 subdomain, name at most 63 letters, digits, '-', '_', '.' starting and ending "
    "with a letter or digit",
    lambda value: _qualified_name(value, prefix_required=False),
)

#: Kubernetes annotation keys: ``ValidateAnnotations`` checks ``IsQualifiedName`` of the key in lower case (so an
#: upper-case prefix passes there, as it does here).
ANNOTATION_KEY = Domain(
    "Kubernetes annotation key",
    "[prefix/]name: prefix a DNS-1123 subdomain (any case), name at most 63 letters, digits, '-', '_', '.' starting "
    "and ending with a letter or digit",
    lambda value: _qualified_name(value.lower(), prefix_required=False),
)

#: Kubernetes label and nodeSelector values: ``IsValidLabelValue``.
LABEL_VALUE = pattern_domain(
    "Kubernetes label value",
    "empty, or at most 63 letters, digits, '-', '_', '.' starting and ending with a letter or digit",
    rf"(?:{_QUALIFIED_PART})?",
    max_length=63,
    min_length=0,
)


def _extended_resource(value: str) -> str | None:
    """``IsExtendedResourceName``: fully qualified (``domain/name``) and outside the ``kubernetes.io`` domain."""
    wrong = _qualified_name(value, prefix_required=True)
    if wrong is not None:
        return wrong
    prefix = value.rpartition("/")[0]
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        return "is in the kubernetes.io domain, which is reserved for Kubernetes' own resources"
    return None


#: The device plugin's extended resource (``huawei.com/Ascend910``, ``nvidia.com/gpu``).
EXTENDED_RESOURCE = Domain(
    "Kubernetes extended resource name",
    "domain/name, e.g. huawei.com/Ascend910 or nvidia.com/gpu (domain a DNS-1123 subdomain outside kubernetes.io)",
    _extended_resource,
)

# distribution/reference: a registry host (with an optional port) is recognised by a '.' or ':' or being
# 'localhost'; every other component is a lower-case path component.
_HOST_PART = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"{_HOST_PART}(?:\.{_HOST_PART})*(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
#: Room left in the 255-character repository name for '/' and the image's own name (a DNS label).
_MAX_REGISTRY = 255 - 1 - 63


def _image_prefix(value: str) -> str | None:
    path = value[:-1] if value.endswith("/") else value
    if not path:
        return "is empty"
    if len(path) > _MAX_REGISTRY:
        return f"is {len(path)} characters long (at most {_MAX_REGISTRY}, to leave room for the image name)"
    first, *rest = path.split("/")
    if "." in first or ":" in first or first == "localhost":
        if not re.fullmatch(_HOST, first):
            return f"registry host {first!r} is not a host name with an optional :port"
    elif not re.fullmatch(_PATH_COMPONENT, first):
        return f"{first!r} is neither a registry host nor a lower-case repository path component"
    for part in rest:
        if not re.fullmatch(_PATH_COMPONENT, part):
            return f"path component {part!r} is not lower-case letters and digits joined by '.', '_', '__' or '-'"
    return None


#: Where the image is pushed: the part of a Docker reference before the image's own name.
IMAGE_REGISTRY = Domain(
    "image repository prefix",
    "registry host[:port] and lower-case path components, e.g. registry.example.com/llm or localhost:5000/team",
    _image_prefix,
)

#: Package indexes the image's pip uses (Dockerfile build args): http(s) URLs of characters that mean the same to a
#: Dockerfile, a shell and pip — no quotes, spaces, ``$``, backslashes or braces — and no credentials (``user:pw@``
#: would be written into the bundle).
INDEX_URL = pattern_domain(
    "package index URL",
    "http:// or https://, a host (and :port) without credentials, then a path of URL characters other than quotes, "
    "spaces, $, backslashes and braces",
    r"https?://[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~:/?#@!&()*+,;=%-]*)?",
    max_length=2048,
)

_PATH_CHARS = re.compile(r"[A-Za-z0-9._+@=,/-]+")


def _absolute_path(value: str) -> str | None:
    """Absolute, normalised (no '.', '..', '//'; one trailing '/' tolerated), portable characters."""
    if not value.startswith("/"):
        return "is not an absolute path"
    if not _PATH_CHARS.fullmatch(value):
        return "has characters other than letters, digits and . _ + @ = , / -"
    trimmed = value.rstrip("/") or "/"
    if value.startswith("//") or posixpath.normpath(trimmed) != trimmed:
        return f"is not a normalised path (write {posixpath.normpath('/' + value.lstrip('/'))})"
    return None


#: Paths inside the pod (the checkpoint directory): absolute, normalised, portable.
ABSOLUTE_PATH = Domain(
    "absolute path",
    "an absolute, normalised path (no '.', '..' or '//') of letters, digits and . _ + @ = , / -",
    _absolute_path,
)

#: Directories that must stay the image's own: mounting a volume on (or above) one hides what the container needs —
#: the bundle itself (the working directory), /dev/shm (its own memory volume), the system's binaries, libraries,
#: configuration and kernel interfaces.
RESERVED_DIRS = (
    POD_WORKDIR,
    "/dev/shm",
    "/dev",
    "/proc",
    "/sys",
    "/etc",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr",
    "/boot",
    "/run",
    "/var/run",
)


def _overlaps(path: str, reserved: tuple[str, ...]) -> str | None:
    """The reserved directory ``path`` equals, lies under, or contains (None when it is clear of all of them)."""
    path = path.rstrip("/") or "/"
    for directory in reserved:
        if path == directory or path.startswith(directory + "/") or directory.startswith(path.rstrip("/") + "/"):
            return directory
    return None


def _mount_path(value: str) -> str | None:
    wrong = _absolute_path(value)
    if wrong is not None:
        return wrong
    clash = _overlaps(value, RESERVED_DIRS)
    return None if clash is None else f"would hide {clash} in the container"


#: Where the shared volume is mounted in each pod.
MOUNT_PATH = Domain(
    "volume mount path",
    "an absolute, normalised path neither on, under nor above " + ", ".join(RESERVED_DIRS),
    _mount_path,
)


def _host_path(value: str) -> str | None:
    wrong = _absolute_path(value)
    if wrong is not None:
        return wrong
    if value.rstrip("/") == "":
        return "is the host's root directory"
    clash = _overlaps(value, (POD_WORKDIR, "/proc", "/sys", "/dev/shm"))
    return None if clash is None else f"would be mounted over {clash} in the container"


#: Host paths mounted into the pod at the same path (drivers, NVMe scratch).
HOST_PATH = Domain(
    "host path",
    f"an absolute, normalised path other than / and clear of {POD_WORKDIR}, /proc, /sys and /dev/shm",
    _host_path,
)

_IFNAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")


def _ifnames(value: str) -> str | None:
    for name in value.split(","):
        if not _IFNAME.fullmatch(name) or name in (".", ".."):
            return f"{name!r} is not a Linux interface name"
    return None


#: NICs for HCCL/NCCL/Gloo bootstrap: HCCL_/NCCL_/GLOO_SOCKET_IFNAME all take a comma-separated list of names.
IFNAMES = Domain(
    "network interface list",
    "Linux interface names (1-15 letters, digits, '_', '.', '-'; no '/', ':' or spaces), comma-separated",
    _ifnames,
)


def _ip_address(value: str) -> str | None:
    import ipaddress

    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return f"{value!r} is not an IP address"
    if str(address) != value or "%" in value:  # one spelling per address; a scope (%eth0) is a host's, not a pod's
        return f"{value!r} is not an IP address in its plain form ({address.compressed.split('%')[0]})"
    return None


#: An address a server binds: IPv4 or IPv6, written the one way Python prints it (0.0.0.0, 127.0.0.1, ::).
IP_ADDRESS = Domain(
    "IP address", "an IPv4 or IPv6 address in its plain form, e.g. 0.0.0.0, 127.0.0.1 or ::", _ip_address
)
