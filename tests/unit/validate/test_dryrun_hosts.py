"""The simulated pods' Volcano host list: who holds rank 0 in an elastic dry run is decided as on a cluster."""

from __future__ import annotations

import pytest

from recipekit.validate.dryrun.cluster.attempts import pod_hosts


def test_each_pod_has_a_loopback_address_of_its_own_and_pod_0_is_the_master() -> None:
    hosts = pod_hosts(12)
    assert hosts[0] == "127.0.0.1" and len(set(hosts)) == 12
    assert all(h.startswith("127.") for h in hosts)


def test_torchruns_rendezvous_gives_rank_0_to_pod_0_whatever_the_pids() -> None:
    """torch's c10d rendezvous ranks its agents by their node descriptor (the ``--local-addr``, then the pid): with
    one address for every pod, pod 1's agent took rank 0 whenever its pid was the lower (a CI failure)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

    hosts = pod_hosts(3)
    agents = [_NodeDesc(hosts[0], 40_000, 0), _NodeDesc(hosts[1], 300, 0), _NodeDesc(hosts[2], 200, 0)]
    assert sorted(agents)[0] is agents[0]
    same = [_NodeDesc("127.0.0.1", 40_000, 0), _NodeDesc("127.0.0.1", 300, 0)]
    assert sorted(same)[0] is same[1]  # what the dry run had: the lower pid won


@pytest.mark.parametrize("pods", [0, 254])
def test_more_pods_than_the_loopback_holds_are_refused(pods: int) -> None:
    with pytest.raises(ValueError, match="1 to 253 pods"):
        pod_hosts(pods)
