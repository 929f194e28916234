"""The native API: every call, its errors, and bad input."""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest

import skyriver
from skyriver import ObjectID


def test_object_ids_round_trip_and_compare():
    a = ObjectID.from_random()
    assert len(a.binary()) == 20 and len(a.hex()) == 40
    assert ObjectID(a.binary()) == a == ObjectID.from_hex(a.hex())
    assert hash(ObjectID(a.binary())) == hash(a)
    assert {a: 1}[ObjectID.from_hex(a.hex())] == 1
    assert pickle.loads(pickle.dumps(a)) == a
    low, high = ObjectID(b"\x00" * 20), ObjectID(b"\xff" * 20)
    assert low < high and sorted([high, low]) == [low, high]
    assert low == ObjectID.nil()
    assert repr(a) == f"ObjectID({a.hex()})"


@pytest.mark.parametrize("bad", [b"", b"x" * 19, b"x" * 21])
def test_object_id_of_the_wrong_length_is_refused(bad):
    with pytest.raises(ValueError, match="20 bytes"):
        ObjectID(bad)


def test_object_id_bad_input_raises():
    with pytest.raises(TypeError):
        ObjectID("a" * 20)
    with pytest.raises(ValueError):
        ObjectID.from_hex("zz" * 20)
    with pytest.raises(ValueError):
        ObjectID.from_hex("ab")


def test_no_daemon_gives_a_connection_error_naming_the_socket(workdir):
    socket = workdir / "nobody.sock"
    with pytest.raises(ConnectionError) as raised:
        skyriver.connect(socket)
    assert isinstance(raised.value, skyriver.SkyriverError)
    assert isinstance(raised.value, skyriver.DaemonUnavailable)
    assert str(socket) in str(raised.value)
    assert "skyriver daemon" in str(raised.value)


def test_create_write_seal_get(client):
    oid = ObjectID.from_random()
    buf = client.create(oid, 5, metadata=b"meta")
    assert not buf.readonly and len(buf) == 5
    memoryview(buf)[:] = b"hello"
    assert not client.contains(oid)
    client.seal(oid)
    assert buf.sealed and buf.readonly
    got = client.get(oid, timeout=0)
    assert bytes(got) == b"hello" and got.metadata == b"meta" and got.id == oid
    assert bytes(got.metadata_buffer()) == b"meta"
    assert client.contains(oid)


def test_writing_to_a_sealed_buffer_raises(client):
    oid = ObjectID.from_random()
    buf = client.create(oid, 4)
    client.seal(oid)
    with pytest.raises(TypeError):
        memoryview(buf)[0] = 1
    assert not np.frombuffer(buf, dtype=np.uint8).flags.writeable
    got = client.get(oid)
    with pytest.raises(TypeError):
        memoryview(got)[0] = 1
    array = np.frombuffer(got, dtype=np.uint8)
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array[0] = 1
    with pytest.raises(skyriver.AlreadySealed):
        client.seal(oid)


def test_abort_drops_an_unsealed_object(client):
    oid = ObjectID.from_random()
    buf = client.create(oid, 100)
    view = memoryview(buf)
    with pytest.raises(BufferError, match="view"):
        client.abort(oid)  # a view still points at the memory
    view.release()
    client.abort(oid)
    assert not client.contains(oid) and client.list() == []
    with pytest.raises(ValueError):
        memoryview(buf)
    client.create(oid, 10).seal()  # the id is free again


@pytest.mark.parametrize(
    "data",
    [
        b"bytes",
        bytearray(b"bytearray"),
        memoryview(b"memoryview"),
        np.arange(100, dtype=np.float64),
        np.zeros((0,), dtype=np.int32),
    ],
    ids=["bytes", "bytearray", "memoryview", "numpy", "empty"],
)
def test_put_takes_any_contiguous_buffer(client, data):
    oid = client.put(data, metadata=b"m")
    got = client.get(oid)
    assert bytes(got) == bytes(memoryview(data).cast("B"))
    assert got.metadata == b"m"


def test_put_with_an_id_and_errors(client):
    oid = ObjectID.from_random()
    assert client.put(b"x", id=oid) == oid
    with pytest.raises(skyriver.ObjectExists):
        client.put(b"y", id=oid)
    with pytest.raises(BufferError, match="contiguous"):
        client.put(np.arange(10)[::2])
    with pytest.raises(BufferError):
        client.put("text is not bytes")
    with pytest.raises(TypeError):
        client.put(b"x", id="not an id")
    with pytest.raises(ValueError, match="20 bytes"):
        client.put(b"x", id=b"short")


def test_bad_sizes_and_timeouts_raise(client):
    oid = ObjectID.from_random()
    with pytest.raises(ValueError, match=">= 0"):
        client.create(oid, -1)
    with pytest.raises(ValueError, match="timeout"):
        client.get(oid, timeout=-1)
    with pytest.raises(ValueError):
        client.evict(-5)
    with pytest.raises(skyriver.ObjectTooLarge):
        client.create(oid, 1 << 40)
    with pytest.raises(TypeError):
        client.get("not ids")


def test_get_waits_times_out_and_reports_missing_as_none(client):
    present = client.put(b"here")
    missing = ObjectID.from_random()
    with pytest.raises(skyriver.Timeout) as raised:
        client.get(missing, timeout=0.05)
    assert isinstance(raised.value, TimeoutError)
    results = client.get([present, missing], timeout=0)
    assert bytes(results[0]) == b"here" and results[1] is None


def test_delete_errors_and_deferral(client):
    oid = client.put(b"held")
    held = client.get(oid)
    with pytest.raises(skyriver.ObjectInUse):
        client.delete(oid)
    assert bytes(held) == b"held"  # still readable while held
    held.release()
    client.flush()
    assert not client.contains(oid)  # the delete happened at the release
    with pytest.raises(skyriver.ObjectNotFound):
        client.delete(oid)
    other = client.put(b"x")
    results = client.delete([other, oid])
    assert results[0] is None and isinstance(results[1], skyriver.ObjectNotFound)


def test_released_buffers_refuse_use(client):
    oid = client.put(b"abc")
    buf = client.get(oid)
    view = memoryview(buf)
    with pytest.raises(BufferError, match="view"):
        buf.release()  # a view is alive
    view.release()
    buf.release()
    assert buf.released
    buf.release()  # twice is harmless
    with pytest.raises(ValueError, match="released"):
        len(buf)
    with pytest.raises(ValueError, match="released"):
        memoryview(buf)
    with pytest.raises(ValueError, match="released"):
        bytes(buf)
    with client.get(oid) as scoped:
        assert bytes(scoped) == b"abc"
    assert scoped.released


def ref_count(client, oid):
    client.flush()
    [entry] = [e for e in client.list() if e["id"] == oid]
    return entry["ref_count"]


def test_refcounts_follow_the_views(client):
    oid = client.put(np.arange(1000, dtype=np.int64))
    buf = client.get(oid)
    array = np.frombuffer(buf, dtype=np.int64)
    view = memoryview(buf)
    del buf
    gc.collect()
    assert ref_count(client, oid) == 1  # the views keep the object referenced
    assert array.sum() == sum(range(1000))
    del array
    assert ref_count(client, oid) == 1
    del view
    assert ref_count(client, oid) == 0  # the last view went


def test_buffers_and_arrays_outlive_their_client(daemon):
    with skyriver.connect(daemon.socket) as client:
        oid = client.put_array(np.arange(10.0))
        array = client.get_array(oid)
        buf = client.get(oid)
    assert client.closed
    with pytest.raises(skyriver.ClientClosed):
        client.contains(oid)
    assert array.sum() == 45.0 and len(bytes(buf)) == 80
    with skyriver.connect(daemon.socket) as observer:
        assert ref_count(observer, oid) == 2
        del array, buf
        gc.collect()
        # The closed client's connection ends with its last buffer: references released.
        for _ in range(100):
            if ref_count(observer, oid) == 0:
                break
            import time

            time.sleep(0.01)
        assert ref_count(observer, oid) == 0


def test_views_share_the_shared_memory(client):
    oid = client.put(np.arange(4096, dtype=np.uint8))
    first, second = client.get(oid), client.get(oid)
    assert first.address == second.address  # two gets, one mapping, no copy
    array = np.frombuffer(first, dtype=np.uint8)
    assert array.ctypes.data == first.address
    assert not array.flags.owndata


def test_put_array_and_get_array(client):
    cases = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4)),
        np.array(7.5),
        np.zeros((2, 0, 3)),
        np.array([(1, 2.0), (3, 4.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
        np.array([True, False]),
        np.arange(5, dtype=">u4"),
    ]
    for original in cases:
        got = client.get_array(client.put_array(original))
        assert got.dtype == original.dtype and got.shape == original.shape
        np.testing.assert_array_equal(got, original)
        assert not got.flags.writeable
    with pytest.raises(TypeError):
        client.put_array(np.array([object()]))
    with pytest.raises(ValueError, match="put_array"):
        client.get_array(client.put(b"raw"))


def test_stats_list_evict(client):
    stats = client.stats()
    assert stats["capacity_bytes"] == 64 << 20 and stats["object_count"] == 0
    oids = [client.put(b"x" * 1000) for _ in range(3)]
    listed = {e["id"]: e for e in client.list()}
    assert set(listed) == set(oids)
    entry = listed[oids[0]]
    assert (entry["data_size"], entry["metadata_size"], entry["sealed"]) == (1000, 0, True)
    assert client.stats()["sealed_count"] == 3
    evicted = client.evict(1)
    assert evicted["objects"] >= 1 and evicted["bytes"] >= 1000
    assert client.stats()["evicted_objects_total"] == evicted["objects"]


def test_out_of_memory_when_everything_is_held(daemons):
    daemon = daemons.start("4MiB")
    with skyriver.connect(daemon.socket) as client:
        held = [client.get(client.put(b"x" * (1 << 20))) for _ in range(3)]
        with pytest.raises(skyriver.OutOfMemory):
            client.put(b"x" * (2 << 20))
        del held


def test_subscribe_sees_seals_and_deletes(client):
    events = client.subscribe()
    assert events.next_event(timeout=0.01) is None
    oid = client.put(b"abc", metadata=b"m")
    event = events.next_event(timeout=5)
    assert (event.kind, event.id, event.data_size, event.metadata_size) == ("sealed", oid, 3, 1)
    client.delete(oid)
    event = next(iter(events))
    assert (event.kind, event.id) == ("deleted", oid)
    events.close()
    assert events.next_event(timeout=1) is None


def test_nodes_and_locate_of_a_lone_daemon(client):
    nodes = client.nodes()
    assert nodes["node"] == client.node and isinstance(nodes["members"], list)
    oid = client.put(b"abc")
    assert client.locate(oid)["holders"] == [client.node]
    assert client.locate(ObjectID.from_random())["holders"] == []
