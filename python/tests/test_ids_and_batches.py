"""Random ids stay unique across forked processes; batches of any size keep the connection."""

from __future__ import annotations

import multiprocessing
import os
import tempfile

import pytest

import skyriver
from skyriver import ObjectID

CHILDREN = 8
IDS_PER_PROCESS = 100_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_children_never_draw_the_same_ids():
    first = ObjectID.from_random()  # the parent draws first: any generator state is warm
    with tempfile.TemporaryDirectory(prefix="skyriver-ids-") as directory:
        children = []
        for n in range(CHILDREN):
            pid = os.fork()
            if pid == 0:  # the child: write the ids to a file, never return into pytest
                code = 1
                try:
                    ids = b"".join(ObjectID.from_random().binary() for _ in range(IDS_PER_PROCESS))
                    with open(os.path.join(directory, f"child-{n}"), "wb") as out:
                        out.write(ids)
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
        for pid in children:
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
        ids = {first.binary()}
        ids.update(ObjectID.from_random().binary() for _ in range(IDS_PER_PROCESS))
        for n in range(CHILDREN):
            with open(os.path.join(directory, f"child-{n}"), "rb") as written:
                data = written.read()
            assert len(data) == IDS_PER_PROCESS * 20
            ids.update(data[i : i + 20] for i in range(0, len(data), 20))
    assert len(ids) == 1 + (CHILDREN + 1) * IDS_PER_PROCESS


def _put_once(socket: str) -> str:
    with skyriver.connect(socket) as client:
        return client.put(b"data").hex()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_pool_of_forked_workers_puts_without_id_clashes(client):
    client.put(b"from the parent")  # the parent drew an id before the pool forks
    with multiprocessing.get_context("fork").Pool(4) as pool:
        ids = pool.map(_put_once, [str(client.socket)] * 8, chunksize=1)
    assert len(set(ids)) == 8
    assert all(client.contains(ObjectID.from_hex(oid)) for oid in ids)


def test_batches_over_the_request_limit_are_split_and_the_connection_survives(client):
    present = client.put(b"late in the batch")
    ids = [ObjectID.from_random() for _ in range(140_000)]
    ids[130_000] = present
    got = client.get(ids, timeout=0)
    assert len(got) == len(ids)
    assert bytes(got[130_000]) == b"late in the batch"
    assert sum(buffer is not None for buffer in got) == 1
    del got
    assert client.contains(present)
    deleted = client.delete(ids)
    assert len(deleted) == len(ids) and deleted[130_000] is None
    assert sum(isinstance(error, skyriver.ObjectNotFound) for error in deleted) == len(ids) - 1
    assert not client.contains(present)
    assert client.put(b"still connected") in {e["id"] for e in client.list()}
