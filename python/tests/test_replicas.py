"""Puts and seals that ask for copies on other nodes: on a daemon without a cluster the object
is stored, and a wait for its copies fails at once naming how many exist."""

import pytest

import skyriver


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
