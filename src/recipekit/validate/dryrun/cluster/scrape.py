"""The dry run as Prometheus: read a pod's metrics endpoint and say which metric names it serves.

The simulated pods share this host, so each gets its own first metrics port through the environment the runtime's
exporter reads (``RECIPEKIT_METRICS_PORT``), as a pod spec could set it. Parsing is the text exposition format's
plain lines: ``# TYPE name kind`` declares a metric, ``name{labels} value`` is a sample.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

from recipekit.bundle.files import RECIPE
from recipekit.runtime.boundary import metricnames
from recipekit.validate.dryrun.workdir.workcopy import WorkCopy
from recipekit.validate.shared.ports import free_port


def metric_ports(work: WorkCopy, pods: int) -> tuple[list[int] | None, list[int]]:
    """A free port per simulated pod when the work copy serves metrics (recipe.yaml ``operations.metrics``), and the
    pods that serve: every one, or pod 0 alone (``ranks: rank0``)."""
    import yaml

    try:
        doc = yaml.safe_load((work.bundle / RECIPE).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return None, []
    metrics = (doc.get("operations") or {}).get("metrics") or {}
    if not metrics.get("ports"):
        return None, []
    ports = [int(p) for p in metrics["ports"]]
    span = max(ports) - min(ports) + 1  # a pod's local rank i listens at its first port + (ports[i] - ports[0])
    chosen: list[int] = []
    taken: set[int] = set()
    for _ in range(pods):
        first = free_port(taken, span)
        chosen.append(first)
        taken.update(range(first, first + span))
    return chosen, list(range(pods)) if metrics.get("ranks") == "all" else [0]


def parse_exposition(text: str) -> tuple[set[str], set[str]]:
    """(declared names, names with at least one sample) of a Prometheus text exposition."""
    declared, sampled = set(), set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 3:
                declared.add(parts[2])
        elif line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            sampled.add(name)
    return declared, sampled


def expected_metric_names() -> tuple[list[str], list[str]]:
    """(names every endpoint must declare, names that must have a sample once training checkpointed): an alert
    count appears with the first alert, the device's utilisation only where the driver reports one."""
    declared = [m.name for m in metricnames.METRICS]
    unsampled = {m.name for m in metricnames.ON_EVENT} | {m.name for m in metricnames.DEVICE_ONLY}
    return declared, [n for n in declared if n not in unsampled]


def missing_names(pod: int, found: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(names pod ``pod``'s endpoint did not declare, names it declared without a value) of one read of it; rank
    0's own figures (the run's recovery) are wanted of pod 0 alone."""
    want_declared, want_sampled = expected_metric_names()
    declared, sampled = set(found["declared"]), set(found["sampled"])
    missing = [n for n in want_declared if n not in declared and n.removesuffix("_total") not in declared]
    rank0 = {m.name for m in metricnames.RANK0_ONLY} if pod != 0 else set()
    return missing, [n for n in want_sampled if n not in sampled and n not in rank0]


def complete(scraped: dict[str, Any]) -> bool:
    """Every pod answered and served every name, each with its value: no later read can find more."""
    pods = scraped.get("pods") or {}
    return bool(pods) and not scraped.get("error") and all(not any(missing_names(p, f)) for p, f in pods.items())


def scrape_pods(ports: dict[int, int]) -> dict[str, Any]:
    """Scrape each pod's endpoint (pod → port); the first error, or every pod's names."""
    found: dict[int, dict[str, Any]] = {}
    for pod, port in sorted(ports.items()):
        one = scrape(port)
        if one.get("error"):
            return {"error": f"pod {pod}'s endpoint did not answer: {one['error']}", "pods": found}
        found[pod] = one
    return {"error": None, "pods": found}


#: How long an endpoint may take to answer: a training process serves it from a thread that waits for the GIL,
#: on a CI runner whose cores every other test keeps busy.
SCRAPE_TIMEOUT_S = 10.0


def scrape(port: int, timeout: float = SCRAPE_TIMEOUT_S) -> dict[str, Any]:
    """GET http://127.0.0.1:<port>/metrics: the names declared and sampled, or the error."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - a local http URL
            text = response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return {"port": port, "error": f"{url}: {exc}"}
    declared, sampled = parse_exposition(text)
    return {"port": port, "declared": sorted(declared), "sampled": sorted(sampled), "error": None}
