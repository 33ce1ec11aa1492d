"""The metrics endpoint's bind address (``ops.metrics_bind``): an IP address, carried in recipe.yaml to the exporter.

0.0.0.0 stays the default — Prometheus scrapes the pod IP — and a recipe may choose 127.0.0.1 (a shared host
network, a local agent) or an IPv6 address. Anything that is not one plain IP address is refused at build time.
"""

from __future__ import annotations

import pytest
import yaml

from recipekit.base.errors import RecipeError
from recipekit.bundle.build import resolve
from recipekit.runtime.boundary.recipeview import MetricsView
from recipekit.validate.shared.ports import free_port
from tests.conftest import render_files


def test_the_default_binds_every_interface_and_the_recipe_yaml_says_so() -> None:
    files = render_files(["recipe=tiny_sft"])
    doc = yaml.safe_load(files["recipe.yaml"])
    assert doc["recipe"]["ops"]["metrics_bind"] == "0.0.0.0"
    assert doc["operations"]["metrics"]["bind"] == "0.0.0.0"


@pytest.mark.parametrize("address", ["127.0.0.1", "'::'", "'::1'", "10.1.2.3"])
def test_an_ip_address_is_carried_to_the_runtime(address: str) -> None:
    files = render_files(["recipe=tiny_sft", f"ops.metrics_bind={address}"])
    doc = yaml.safe_load(files["recipe.yaml"])
    assert doc["operations"]["metrics"]["bind"] == address.strip("'")


@pytest.mark.parametrize(
    "address",
    ["localhost", "'0.0.0.0 '", "'0.0.0.0;id'", "'fe80::1%eth0'", "'::0'", "256.1.1.1", "'0:0:0:0:0:0:0:1'", "''"],
)
def test_anything_but_one_plain_ip_address_is_refused_with_its_key(address: str) -> None:
    with pytest.raises(RecipeError) as info:
        resolve(["recipe=tiny_sft", f"ops.metrics_bind={address}"])
    keys = {p.key for p in info.value.problems}
    assert "ops.metrics_bind" in keys, info.value
    message = next(p.message for p in info.value.problems if p.key == "ops.metrics_bind")
    assert "IP address" in message and "\n" not in message


@pytest.mark.parametrize("bind", ["127.0.0.1", "0.0.0.0"])
def test_the_exporter_listens_on_the_bind_address(monkeypatch, bind: str) -> None:
    pytest.importorskip("prometheus_client")
    from recipekit.runtime.ops.exporter import Exporter, start_exporter

    port = free_port()
    monkeypatch.setenv("RECIPEKIT_METRICS_PORT", str(port))
    settings = MetricsView(ports=[9400], ranks="all", bind=bind)
    exporter = start_exporter(settings, "job", 0, 0)
    try:
        assert isinstance(exporter, Exporter)
        assert exporter.server[0].server_address[:2] == (bind, port)
    finally:
        exporter.close()


def test_a_loopback_bind_warns_that_the_podmonitor_cannot_reach_it() -> None:
    assert any("PodMonitor" in w for w in resolve(["recipe=tiny_sft", "ops.metrics_bind=127.0.0.1"]).plan.warnings)
    assert not any("metrics_bind" in w for w in resolve(["recipe=tiny_sft"]).plan.warnings)
    readme = render_files(["recipe=tiny_sft", "ops.metrics_bind=127.0.0.1"])["README.md"].decode()
    assert "serves Prometheus metrics on address 127.0.0.1" in readme
