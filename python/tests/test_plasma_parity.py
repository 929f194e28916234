"""pyarrow.plasma 11 behaviours, tested the way Plasma's users and Plasma's own test suite
(pyarrow/tests/test_plasma.py) exercised them: stores from ``start_plasma_store`` in fixtures,
``pytest.raises(pa.lib.ArrowException)``, the notification socket read by hand."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys

import numpy as np
import pytest

import skyriver
import skyriver.plasma as plasma

pa = pytest.importorskip("pyarrow")

DEFAULT_PLASMA_STORE_MEMORY = 10**8


@pytest.fixture
def plasma_store_name():
    with plasma.start_plasma_store(DEFAULT_PLASMA_STORE_MEMORY) as (name, proc):
        yield name


@pytest.fixture
def plasma_client(plasma_store_name):
    client = plasma.connect(plasma_store_name)
    yield client
    client.disconnect()


def random_object_id():
    return plasma.ObjectID(np.random.bytes(20))


def read_notification(rsock):
    # As Plasma's test_subscribe_socket: an 8-byte length, then the message.
    msg_len, = struct.unpack("L", rsock.recv(8))
    content = b""
    while len(content) < msg_len:
        content += rsock.recv(msg_len - len(content))
    return content


def test_errors_are_arrow_exceptions(plasma_client):
    object_id = random_object_id()
    plasma_client.create_and_seal(object_id, b"x")
    with pytest.raises(pa.lib.ArrowException):
        plasma_client.create(object_id, 10)
    with pytest.raises(pa.lib.ArrowException) as full:
        plasma_client.create(random_object_id(), DEFAULT_PLASMA_STORE_MEMORY + 1)
    assert isinstance(full.value, plasma.PlasmaStoreFull)
    with pytest.raises(pa.lib.ArrowException) as missing:
        plasma_client.hash(random_object_id())
    assert isinstance(missing.value, plasma.PlasmaObjectNotFound)
    # Still Skyriver's own classes.
    with pytest.raises(skyriver.ObjectExists):
        plasma_client.create(object_id, 10)
    assert issubclass(plasma.PlasmaStoreFull, skyriver.OutOfMemory)
    assert issubclass(plasma.PlasmaObjectNotFound, skyriver.ObjectNotFound)


def test_object_id_takes_only_20_bytes():
    with pytest.raises(ValueError):
        plasma.ObjectID("hello")
    with pytest.raises(ValueError):
        plasma.ObjectID(b"too short")
    object_id = plasma.ObjectID(20 * b"a")
    assert object_id.binary() == 20 * b"a"
    assert object_id == skyriver.ObjectID(20 * b"a")
    assert hash(object_id) == hash(skyriver.ObjectID(20 * b"a"))
    assert object_id != 20 * b"a"  # no id equals its bytes, as Plasma's
    copy = pickle.loads(pickle.dumps(object_id))
    assert copy == object_id and isinstance(copy, plasma.ObjectID)
    assert isinstance(plasma.ObjectID.from_random(), plasma.ObjectID)


def test_ids_handed_out_are_plasma_ids(plasma_client):
    object_id = plasma_client.put(b"value")
    assert isinstance(object_id, plasma.ObjectID)
    assert all(isinstance(listed, plasma.ObjectID) for listed in plasma_client.list())


def test_evict_returns_data_and_metadata_sizes(plasma_client):
    plasma_client.create_and_seal(random_object_id(), b"x" * 1000, b"m" * 24)
    assert plasma_client.evict(1) == 1024
    assert plasma_client.evict(1) == 0  # nothing left to evict


def test_a_store_smaller_than_a_mebibyte():
    with plasma.start_plasma_store(10000) as (name, proc):
        client = plasma.connect(name)
        assert client.store_capacity() == 10000
        object_id = random_object_id()
        np.frombuffer(client.create(object_id, 5000), dtype=np.uint8)[:] = 7
        client.seal(object_id)
        with pytest.raises(plasma.PlasmaStoreFull):
            client.create(random_object_id(), 20000)
        client.disconnect()


def test_store_capacity_is_the_memory_asked_for(plasma_client):
    assert plasma_client.store_capacity() == DEFAULT_PLASMA_STORE_MEMORY


def test_subscribe_socket(plasma_client):
    # Plasma's test_subscribe_socket, as written there.
    plasma_client.subscribe()
    rsock = plasma_client.get_notification_socket()
    for i in [1, 10, 100]:
        object_ids = [random_object_id() for _ in range(i)]
        metadata_sizes = [np.random.randint(1000) for _ in range(i)]
        data_sizes = [np.random.randint(1000) for _ in range(i)]
        for j in range(i):
            plasma_client.create(
                object_ids[j], data_sizes[j], metadata=bytearray(np.random.bytes(metadata_sizes[j]))
            )
            plasma_client.seal(object_ids[j])
        for j in range(i):
            content = read_notification(rsock)
            recv_objids, recv_dsizes, recv_msizes = plasma_client.decode_notifications(content)
            assert object_ids[j] == recv_objids[0]
            assert metadata_sizes[j] == recv_msizes[0]
            assert data_sizes[j] == recv_dsizes[0]


def test_subscribe_socket_deletion_and_objects_already_there(plasma_client):
    present = random_object_id()
    plasma_client.create_and_seal(present, b"abc", b"m")
    plasma_client.subscribe()
    rsock = plasma_client.get_notification_socket()
    # The sealed objects already in the store come first, as Plasma's store sent them.
    assert plasma_client.decode_notifications(read_notification(rsock)) == ([present], [3], [1])
    plasma_client.delete([present])
    assert plasma_client.decode_notifications(read_notification(rsock)) == ([present], [-1], [-1])
    # get_next_notification reads the same socket.
    later = random_object_id()
    plasma_client.create_and_seal(later, b"later")
    assert plasma_client.get_next_notification() == (later, 5, 0)


def test_notification_messages_are_plasma_flatbuffers(plasma_client):
    flatbuffers = pytest.importorskip("flatbuffers")
    object_id = random_object_id()
    plasma_client.subscribe()
    rsock = plasma_client.get_notification_socket()
    plasma_client.create_and_seal(object_id, b"x" * 300, b"meta")
    content = read_notification(rsock)
    # PlasmaNotification { object_info: [ObjectInfo] } read with the flatbuffers package's
    # own table reader; ObjectInfo's fields: object_id 0, data_size 1, metadata_size 2, ...,
    # is_deletion 7 (Arrow 11's common.fbs).
    root = flatbuffers.table.Table(content, flatbuffers.encode.Get(flatbuffers.packer.uoffset, content, 0))
    vector = root.Vector(root.Offset(4))
    assert root.VectorLen(root.Offset(4)) == 1
    info = flatbuffers.table.Table(content, root.Indirect(vector))

    def field(slot, kind, default=0):
        offset = info.Offset(4 + 2 * slot)
        return info.Get(kind, offset + info.Pos) if offset else default

    assert info.String(info.Offset(4) + info.Pos) == object_id.binary()
    assert field(1, flatbuffers.number_types.Int64Flags) == 300
    assert field(2, flatbuffers.number_types.Int64Flags) == 4
    assert not field(7, flatbuffers.number_types.BoolFlags, False)


def test_decode_notifications_reads_plasma_stores_own_messages(plasma_client):
    # Two messages pyarrow.plasma 11's plasma_store wrote for an object of 20 b"A"s: sealed
    # (1000 data and 3 metadata bytes, with its digest), then deleted.
    sealed = bytes.fromhex(
        "100000000000000000000600080004000600000004000000010000001800000000001200200004000c00"
        "14000000000000000800120000002c00000018000000e803000000000000030000000000000000000000"
        "0800000058ba62c45d6ab6530000000014000000414141414141414141414141414141414141414100000000"
    )
    deleted = bytes.fromhex(
        "0c00000000000600080004000600000004000000010000001800000014000c0008000000000000000000"
        "00000000070014000000000000010400000014000000414141414141414141414141414141414141414100000000"
    )
    object_id = plasma.ObjectID(20 * b"A")
    assert plasma_client.decode_notifications(sealed) == ([object_id], [1000], [3])
    assert plasma_client.decode_notifications(deleted) == ([object_id], [-1], [-1])


def test_list_times(plasma_client, monkeypatch):
    clock = iter([1_700_000_000.25, 1_700_000_003.5])
    monkeypatch.setattr(plasma.time, "time", lambda: next(clock, 1_700_000_010.0))
    object_id = random_object_id()
    buffer = plasma_client.create(object_id, 10)
    plasma_client.seal(object_id)
    del buffer
    entry = plasma_client.list()[object_id]
    # Unix seconds of the create, and whole seconds from create to seal, as Plasma's.
    assert entry["create_time"] == 1_700_000_000
    assert entry["construct_duration"] == 3
    assert entry["state"] == "sealed"
    unsealed = random_object_id()
    plasma_client.create(unsealed, 10)
    assert plasma_client.list()[unsealed]["construct_duration"] == -1


def test_hash(plasma_client):
    first, second, other = random_object_id(), random_object_id(), random_object_id()
    plasma_client.create_and_seal(first, b"same data", b"meta")
    plasma_client.create_and_seal(second, b"same data", b"meta")
    plasma_client.create_and_seal(other, b"same data", b"other meta")
    digest = plasma_client.hash(first)
    assert isinstance(digest, bytes) and len(digest) == 8
    assert plasma_client.hash(second) == digest
    assert plasma_client.hash(other) != digest
    with pytest.raises(plasma.PlasmaObjectNotFound):
        plasma_client.hash(random_object_id())


def test_start_plasma_store_stops_the_store_at_the_end():
    with plasma.start_plasma_store(DEFAULT_PLASMA_STORE_MEMORY) as (name, proc):
        assert proc.poll() is None
        plasma.connect(name).disconnect()
    assert proc.poll() is not None
    assert not os.path.exists(name)


def test_a_file_external_store_spills_there_and_others_are_refused(tmp_path):
    with plasma.start_plasma_store(10**7, external_store=f"file://{tmp_path}") as (name, _):
        plasma.connect(name).disconnect()
    # The daemon's spill files live in its own directory under the one given.
    assert (tmp_path / "node-0").is_dir()
    run = subprocess.run(
        [sys.executable, "-m", "skyriver._cli", "plasma_store",
         "-m", "10000000", "-s", str(tmp_path / "plasma.sock"), "-e", "s3://bucket"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode != 0
    assert "file://DIR" in run.stderr
    assert not (tmp_path / "plasma.sock").exists()


def store_stats(client):
    """The store's counters, from ``debug_string``'s ``name: value`` lines."""
    lines = client.debug_string().splitlines()
    return {name: int(value) for name, value in (line.split(": ") for line in lines)}


def test_a_store_with_an_external_store_spills_and_gives_every_object_back(tmp_path):
    # 24 MiB into a 10 MB store: the first objects go to disk, none is forgotten.
    with plasma.start_plasma_store(
        10**7, external_store=f"file://{tmp_path}", spill_limit=64 << 20
    ) as (name, _):
        client = plasma.connect(name)
        objects = [(random_object_id(), np.random.bytes(1 << 20)) for _ in range(24)]
        for object_id, data in objects:
            client.create_and_seal(object_id, data, b"m")
        stats = store_stats(client)
        assert stats["spill_limit_bytes"] == 64 << 20, stats
        assert stats["spilled_objects"] > 0 and stats["spills_total"] > 0, stats
        assert list((tmp_path / "node-0").iterdir()), "spill files were written"
        for object_id, data in objects:
            [(metadata, buffer)] = client.get_buffers([object_id], timeout_ms=30_000, with_meta=True)
            assert buffer is not None, object_id
            assert bytes(memoryview(buffer)) == data and metadata == b"m", object_id
            del buffer
        stats = store_stats(client)
        assert stats["restores_total"] > 0, stats
        assert stats["evicted_objects_total"] == 0, stats
        assert stats["spilled_objects_lost_total"] == 0, stats
        client.disconnect()
    with pytest.raises(ValueError, match="external_store"):
        with plasma.start_plasma_store(10**7, spill_limit=1 << 20):
            pass


def test_unsupported_calls_say_so(plasma_client):
    with pytest.raises(NotImplementedError):
        plasma_client.set_client_options("client", 1000)
    assert "capacity_bytes" in plasma_client.debug_string()
