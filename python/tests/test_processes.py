"""Threads, processes, fork and a second daemon."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import skyriver
from skyriver import ObjectID

from conftest import free_port


def mapping_of(address: int) -> str:
    """The /proc/self/maps line of the mapping that holds `address`."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            span = line.split()[0]
            start, end = (int(part, 16) for part in span.split("-"))
            if start <= address < end:
                return line.strip()
    raise AssertionError(f"{address:#x} is not mapped")


def test_another_process_reads_an_array_zero_copy(daemon):
    # One process puts an array; this one reads it in place in the daemon's shared memory.
    writer = textwrap.dedent(
        """
        import sys, numpy as np, skyriver
        with skyriver.connect(sys.argv[1]) as client:
            print(client.put_array(np.arange(1 << 20, dtype=np.float64)).hex())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", writer, str(daemon.socket)], check=True, capture_output=True, text=True
    )
    oid = ObjectID.from_hex(out.stdout.strip())
    with skyriver.connect(daemon.socket) as client:
        array = client.get_array(oid)
        assert array[-1] == (1 << 20) - 1 and not array.flags.owndata
        # The array's bytes lie in a shared mapping of the daemon's memfd arena, not a copy.
        mapping = mapping_of(array.ctypes.data)
        assert "memfd:skyriver" in mapping and mapping.split()[1][3] == "s", mapping
        assert client.get(oid).address == array.ctypes.data


def test_threads_share_one_client(client):
    errors = []
    # One get waits for ever on the shared client the whole time.
    late = ObjectID.from_random()
    waiter_result = []
    waiter = threading.Thread(target=lambda: waiter_result.append(bytes(client.get(late))))
    waiter.start()

    def work(seed: int) -> None:
        try:
            for n in range(100):
                payload = np.full(100 + n, seed, dtype=np.uint8)
                oid = client.put(payload)
                assert bytes(client.get(oid, timeout=0)) == payload.tobytes()
                assert client.contains(oid)
                np.testing.assert_array_equal(client.get_array(client.put_array(payload)), payload)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    workers = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    client.put(b"finally", id=late)
    waiter.join(timeout=10)
    assert waiter_result == [b"finally"]


def test_a_blocking_get_releases_the_gil(client):
    oid = ObjectID.from_random()
    done = threading.Event()
    thread = threading.Thread(target=lambda: (client.get(oid, timeout=None), done.set()))
    thread.start()
    # Python code keeps running in this thread while the other waits inside the get.
    started = time.monotonic()
    spins = 0
    while time.monotonic() - started < 0.2:
        spins += 1
    assert spins > 10_000 and not done.is_set()
    client.put(b"x", id=oid)
    thread.join(timeout=10)
    assert done.is_set()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_a_clear_error_until_it_reconnects(client):
    oid = client.put(b"from the parent")
    buf = client.get(oid)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            try:
                client.contains(oid)
                message = b"no error"
            except skyriver.ForkedError as error:
                message = b"forked" if "reconnect" in str(error) else str(error).encode()
            if message == b"forked":
                assert bytes(buf) == b"from the parent"  # the inherited mapping still reads
                client.reconnect()
                assert bytes(client.get(oid)) == b"from the parent"
                client.put(b"from the child", id=ObjectID(b"c" * 20))
                code = 0
            os.write(write, message)
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    message = os.read(read, 1000)
    os.close(read)
    assert message == b"forked" and os.waitstatus_to_exitcode(status) == 0
    # The parent's connection was untouched by the child.
    assert bytes(client.get(ObjectID(b"c" * 20))) == b"from the child"
    assert bytes(buf) == b"from the parent"
    buf.release()
    client.flush()
    assert [e["ref_count"] for e in client.list() if e["id"] == oid] == [0]


def two_node_cluster(daemons, head_args=(), member_args=()):
    """A head and a member on loopback (TCP fabric), each with its extra daemon flags: their
    daemons."""
    port = free_port()
    head = daemons.start("64MiB", "--head", f"127.0.0.1:{port}", "--node-id", "0",
                         "--listen", "127.0.0.1:0", "--fabric", "tcp", *head_args, name="head")
    member = daemons.start("64MiB", "--join", f"127.0.0.1:{port}", "--node-id", "1",
                           "--listen", "127.0.0.1:0", "--fabric", "tcp", *member_args,
                           name="member")
    return head, member


def wait_for_members(client, count):
    """Polls (up to 10 s) until `client`'s daemon lists `count` members."""
    deadline = time.monotonic() + 10
    while len(client.nodes()["members"]) < count:
        assert time.monotonic() < deadline, f"{count} members join"
        time.sleep(0.01)


def test_fetch_across_two_daemons(daemons):
    head, member = two_node_cluster(daemons)
    with skyriver.connect(head.socket) as there, skyriver.connect(member.socket) as here:
        payload = np.arange(1 << 18, dtype=np.int32)
        oid = there.put_array(payload)
        assert not here.contains(oid)
        fetched = here.fetch(oid, timeout=20)
        assert fetched.metadata.startswith(skyriver.ARRAY_METADATA_PREFIX)
        np.testing.assert_array_equal(np.frombuffer(fetched, dtype=np.int32), payload)
        assert here.contains(oid)  # now a local copy
        np.testing.assert_array_equal(here.get_array(oid), payload)
        assert sorted(here.locate(oid)["holders"]) == [0, 1]
        missing = ObjectID.from_random()
        with pytest.raises((skyriver.ObjectNotFound, skyriver.Timeout)):
            here.fetch(missing, timeout=0.3)
        assert here.fetch([oid, missing], timeout=0.3)[1] is None


def test_a_put_without_an_id_names_its_node(daemons):
    head, member = two_node_cluster(daemons)
    with skyriver.connect(head.socket) as there, skyriver.connect(member.socket) as here:
        oid = there.put(b"made over there")
        # "SKY", version 1, then the node's number: the fetch asks that node first.
        assert oid.binary()[:8] == b"SKY\x01" + there.node.to_bytes(4, "big")
        fresh = here.new_id()
        assert fresh.binary()[:8] == b"SKY\x01" + here.node.to_bytes(4, "big")
        assert fresh != here.new_id()
        wait_for_members(here, 2)
        assert bytes(here.fetch(oid, timeout=10)) == b"made over there"
        # Plasma-style random ids name no node and are found through the directory.
        assert ObjectID.from_random().binary()[:4] != b"SKY\x01"


def test_fetch_polls_with_timeout_zero_and_ids_name_one_content(daemons):
    head, member = two_node_cluster(daemons)
    with skyriver.connect(head.socket) as there, skyriver.connect(member.socket) as here:
        # timeout=0 polls: an object another live node holds is still fetched ...
        oid = there.put(b"held over there")
        wait_for_members(here, 2)
        assert bytes(here.fetch(oid, timeout=0)) == b"held over there"
        # ... and an id nobody holds fails at once, not after a grace or the timeout.
        started = time.monotonic()
        with pytest.raises(skyriver.ObjectNotFound):
            here.fetch(ObjectID.from_random(), timeout=0)
        assert time.monotonic() - started < 1.0
        # One id names one content: other bytes under a held id are refused on any node.
        taken = ObjectID.from_random()
        there.put(b"AAAA", id=taken)
        with pytest.raises(skyriver.ObjectExists):
            here.put(b"BBBB", id=taken)
        assert not here.contains(taken)
        assert here.locate(taken)["digest"] == there.locate(taken)["digest"]
        assert len(here.locate(taken)["digest"]) == 16
