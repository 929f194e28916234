"""Puts and seals that ask for copies on other nodes: on a daemon without a cluster the object
is stored, and a wait for its copies fails at once naming how many exist; on two nodes the
copies are made."""


import pytest

import skyriver
from test_processes import two_node_cluster, wait_for_members


def test_a_put_waiting_for_copies_without_a_cluster_names_the_one_copy(client: skyriver.Client) -> None:
    with pytest.raises(skyriver.TooFewReplicas, match="1 of its 2 copies"):
        client.put(b"x" * 1000, id=b"\x01" * 20, replicas=2, wait_replicas=True, replicas_timeout=5.0)
    assert client.contains(b"\x01" * 20), "the object is stored either way"


def test_a_seal_waiting_for_copies_without_a_cluster_names_the_one_copy(client: skyriver.Client) -> None:
    oid = b"\x02" * 20
    buffer = client.create(oid, 4096)
    view = memoryview(buffer)
    view[:5] = b"hello"
    view.release()
    with pytest.raises(skyriver.TooFewReplicas, match="1 of its 3 copies"):
        client.seal(oid, replicas=3, wait_replicas=True, replicas_timeout=5.0)
    assert client.contains(oid)
    assert bytes(memoryview(client.get(oid, timeout=0))[:5]) == b"hello"


def test_a_seal_that_does_not_wait_returns_at_once(client: skyriver.Client) -> None:
    oid = b"\x03" * 20
    buffer = client.create(oid, 10)
    buffer.seal(replicas=2)
    assert client.contains(oid)


def test_replica_options_are_checked(client: skyriver.Client) -> None:
    oid = b"\x04" * 20
    client.create(oid, 10)
    with pytest.raises(ValueError):
        client.seal(oid, replicas=2, wait_replicas=True, replicas_timeout=-1.0)


def test_a_count_above_the_most_is_refused_naming_it(client: skyriver.Client) -> None:
    with pytest.raises(ValueError, match="the most is 16"):
        client.put(b"x" * 10, id=b"\x05" * 20, replicas=17)
    assert not client.contains(b"\x05" * 20), "nothing is stored"


def test_puts_and_seals_with_two_copies_on_two_nodes(daemons) -> None:
    """On a real two-node cluster, a put and a seal that wait for two copies return once the
    other node holds one."""
    head, member = two_node_cluster(daemons)
    with skyriver.connect(head.socket) as there, skyriver.connect(member.socket) as here:
        wait_for_members(here, 2)
        oid = here.put(b"kept twice " * 100, replicas=2, wait_replicas=True, replicas_timeout=30.0)
        assert there.contains(oid), "the other copy is sealed before the put returns"
        assert sorted(here.locate(oid)["holders"]) == [0, 1]
        sealed = b"\x06" * 20
        buffer = here.create(sealed, 4096)
        view = memoryview(buffer)
        view[:5] = b"hello"
        view.release()
        here.seal(sealed, replicas=2, wait_replicas=True, replicas_timeout=30.0)
        assert there.contains(sealed)
        assert bytes(memoryview(there.get(sealed, timeout=0))[:5]) == b"hello"


def test_locate_copies_and_nodes_name_each_copy_and_its_failure_domain(daemons) -> None:
    """Two nodes in two failure domains: a put with two copies has a copy of record in each,
    and `locate_copies` and `nodes` say which domain each node is in."""
    _, member = two_node_cluster(daemons, head_args=("--failure-domain", "rack-a"),
                                 member_args=("--failure-domain", "rack-b"))
    with skyriver.connect(member.socket) as here:
        wait_for_members(here, 2)
        domains = {m["node"]: m["failure_domain"] for m in here.nodes()["members"]}
        assert domains == {0: "rack-a", 1: "rack-b"}
        oid = here.put(b"two racks " * 100, replicas=2, wait_replicas=True, replicas_timeout=30.0)
        located = here.locate_copies(oid)
        assert located["records_known"] is True
        assert located["wanted"] == 2
        assert located["sizes"] == (1000, 0)
        copies = sorted((c["node"], c["failure_domain"], c["of_record"]) for c in located["copies"])
        assert copies == [(0, "rack-a", True), (1, "rack-b", True)]
