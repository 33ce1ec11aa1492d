"""The Prometheus endpoint of one training process (``prometheus_client``, in the image when metrics are on).

Which processes serve is the recipe's choice (``ops.metrics_ranks``: global rank 0, or every rank for per-device
figures); a process with local rank i listens on ``ports[i]`` (recipe.yaml ``operations.metrics.ports``, the same
ports the Job's container declares and the PodMonitor scrapes), on the address ``operations.metrics.bind``
(``ops.metrics_bind``: 0.0.0.0 by default, as Prometheus scrapes the pod IP; 127.0.0.1 where the host's network is
shared). The dry run runs several pods on one host, so the pod's environment may move the first port
(``RECIPEKIT_METRICS_PORT``), as a pod spec may.

Metrics never stop training: a missing prometheus_client or a port already taken is one warning, and the exporter
then does nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ..boundary import metricnames as names
from ..boundary.common import LOG
from ..boundary.metricnames import PORT_ENV
from ..boundary.recipeview import MetricsView
from ..volume.recovery import RecoveryLog, history, read, summary

#: Every interface: Prometheus scrapes the pod IP (the usual recipe.yaml ``operations.metrics.bind``).
DEFAULT_BIND = "0.0.0.0"


class Exporter:
    """Gauges and the alert counter of :mod:`metricnames`, labelled with the Job's name and this rank."""

    def __init__(self, port: int, job: str, rank: int, bind: str = DEFAULT_BIND):
        import prometheus_client as prom

        self.registry = prom.CollectorRegistry(auto_describe=True)
        self.port, self.labels = port, {names.JOB_LABEL: job, names.RANK_LABEL: str(rank)}
        self._series: dict[str, Any] = {}
        for metric in names.METRICS:
            kind = prom.Counter if metric.kind == "counter" else prom.Gauge
            labels = [*names.LABELS, metric.label] if metric.label else list(names.LABELS)
            self._series[metric.name] = kind(metric.name, metric.help, labels, registry=self.registry)
        self.server = prom.start_http_server(port, addr=bind, registry=self.registry)

    def set(self, metric: names.Metric, value: float, label: str = "") -> None:
        """Set a gauge (``label``: the value of the metric's own label, where it has one)."""
        self._of(metric, label).set(value)

    def inc(self, metric: names.Metric, label: str = "", amount: float = 1.0) -> None:
        """Add to a counter (``label`` as for :meth:`set`)."""
        self._of(metric, label).inc(amount)

    def alert(self, alert: str) -> None:
        self.inc(names.ALERTS, alert)

    def _of(self, metric: names.Metric, label: str) -> Any:
        extra = {metric.label: label} if metric.label else {}
        return self._series[metric.name].labels(**self.labels, **extra)

    def close(self) -> None:
        server = self.server[0] if isinstance(self.server, tuple) else None
        if server is not None:
            server.shutdown()


class NoExporter:
    """What a process that serves no metrics uses: every call does nothing."""

    port = None

    def set(self, metric: names.Metric, value: float, label: str = "") -> None:
        pass

    def inc(self, metric: names.Metric, label: str = "", amount: float = 1.0) -> None:
        pass

    def alert(self, alert: str) -> None:
        pass

    def close(self) -> None:
        pass


def start_exporter(settings: MetricsView, job: str, rank: int, local_rank: int) -> Exporter | NoExporter:
    """This process's exporter per recipe.yaml's ``operations.metrics`` (``ports``, ``ranks``, ``bind``), or a
    no-op."""
    ports = settings.ports
    serves = ports and (settings.ranks == "all" or rank == 0)
    if not serves or local_rank >= len(ports):
        return NoExporter()
    first = os.environ.get(PORT_ENV, "")
    port = (int(first) if first.isdigit() else ports[0]) + (ports[local_rank] - ports[0])
    bind = settings.bind
    try:
        exporter = Exporter(port, job, rank, bind)
    except ImportError:
        LOG.log(logging.WARNING, "metrics: prometheus_client is not installed; serving no metrics")
        return NoExporter()
    except OSError as exc:
        LOG.warning("metrics: cannot listen on %s port %d (%s); serving no metrics", bind, port, exc.strerror or exc)
        return NoExporter()
    LOG.info("metrics: serving Prometheus metrics on %s port %d", bind, port)
    return exporter


def publish_recovery(log: RecoveryLog, exporter: Any) -> None:
    """Rank 0 sets the recovery gauges (restarts, steps lost, the last recovery's seconds) from the run's recovery
    records: the Trainer's RecoveryCallback and the Megatron room call it at the same points."""
    if not log.enabled:
        return
    figures = summary(history(read(log.dir)))
    exporter.set(names.RESTARTS, figures["restarts"])
    exporter.set(names.STEPS_LOST, figures["steps_lost"])
    exporter.set(names.RECOVERY_SECONDS, figures["last_mttr_s"] or 0.0)
