"""skyriver.plasma driven the way pyarrow.plasma's documentation and tests drive Plasma."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import skyriver
import skyriver.plasma as plasma

pa = pytest.importorskip("pyarrow")


@pytest.fixture
def store(daemons):
    # As a script that started plasma_store would: plain bytes for -m, the socket with -s.
    daemon = daemons.start("100000000", name="plasma")
    return str(daemon.socket)


@pytest.fixture
def client(store):
    connected = plasma.connect(store)
    yield connected
    connected.disconnect()


def random_id():
    return plasma.ObjectID(np.random.bytes(20))


def test_documentation_walkthrough(client):
    # "The Plasma In-Memory Object Store" page of the Arrow docs, step by step.
    object_id = plasma.ObjectID(20 * b"a")
    buffer = memoryview(client.create(object_id, 1000))
    for i in range(1000):
        buffer[i] = i % 128
    client.seal(object_id)
    [buffer] = client.get_buffers([object_id])
    assert isinstance(buffer, pa.Buffer)
    view = memoryview(buffer)
    assert view[1] == 1 and view[129] == 1 and view.readonly
    # put and get of Python values
    object_id = client.put("hello, world")
    assert client.get(object_id) == "hello, world"
    # numpy arrays through pyarrow buffers
    data = np.random.randn(100)
    object_id = random_id()
    buf = client.create(object_id, data.nbytes)
    array = np.frombuffer(buf, dtype=data.dtype)
    array[:] = data
    client.seal(object_id)
    [got] = client.get_buffers([object_id])
    np.testing.assert_array_equal(np.frombuffer(got, dtype=data.dtype), data)
    assert client.store_capacity() == 100_000_000


def test_create_with_metadata_and_get_buffers_with_meta(client):
    for length in [0, 1, 1000, 1 << 20]:
        object_id = random_id()
        metadata = np.random.bytes(17)
        memory_buffer = np.frombuffer(client.create(object_id, length, metadata), dtype="uint8")
        memory_buffer[:] = np.arange(length, dtype=np.uint64).astype(np.uint8)
        client.seal(object_id)
        [(meta, data)] = client.get_buffers([object_id], timeout_ms=0, with_meta=True)
        assert meta == metadata
        np.testing.assert_array_equal(np.frombuffer(data, dtype="uint8"), memory_buffer)
        [meta_buffer] = client.get_metadata([object_id])
        assert meta_buffer.to_pybytes() == metadata


def test_create_existing_and_store_full(client):
    object_id = random_id()
    client.create(object_id, 100)
    with pytest.raises(plasma.PlasmaObjectExists):
        client.create(object_id, 100)
    with pytest.raises(skyriver.ObjectExists):  # the Skyriver class catches it too
        client.create_and_seal(object_id, b"x")
    with pytest.raises(plasma.PlasmaStoreFull):
        client.create(random_id(), 200_000_000)


def test_timeouts_give_partial_results(client):
    present = random_id()
    client.create_and_seal(present, b"present", b"meta")
    missing = random_id()
    started = time.monotonic()
    buffers = client.get_buffers([present, missing], timeout_ms=100)
    assert time.monotonic() - started >= 0.09
    assert buffers[0].to_pybytes() == b"present" and buffers[1] is None
    assert client.get_buffers([missing], timeout_ms=0, with_meta=True) == [(None, None)]
    assert client.get([missing], timeout_ms=0) == [plasma.ObjectNotAvailable]
    assert client.get(missing, timeout_ms=0) is plasma.ObjectNotAvailable
    assert client.get_metadata([missing], timeout_ms=0) == [None]


def test_get_waits_for_a_seal_from_another_client(client, store):
    object_id = random_id()
    other = plasma.connect(store)

    def later():
        time.sleep(0.1)
        other.create_and_seal(object_id, b"late")

    thread = threading.Thread(target=later)
    thread.start()
    [buffer] = client.get_buffers([object_id])  # timeout_ms=-1: wait for ever
    thread.join()
    assert buffer.to_pybytes() == b"late"
    other.disconnect()


def test_put_get_values_and_raw_buffers(client):
    values = [1, "string", {"a": [1, 2]}, np.arange(10.0), np.zeros((3, 4), dtype=np.int8)]
    for value in values:
        got = client.get(client.put(value))
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(got, value)
            assert not got.flags.writeable  # read-only over shared memory, as Plasma's
        else:
            assert got == value
    ids = [client.put(v) for v in values[:3]]
    assert client.get(ids) == values[:3]
    raw = client.put_raw_buffer(b"raw bytes", metadata=b"m")
    [(meta, data)] = client.get_buffers([raw], with_meta=True)
    assert (meta, data.to_pybytes()) == (b"m", b"raw bytes")
    fixed = random_id()
    assert client.put(42, object_id=fixed) == fixed and client.get(fixed) == 42


def test_contains_delete_and_list_fields(client):
    object_id = random_id()
    assert not client.contains(object_id)
    buffer = client.create(object_id, 100, b"meta")
    listed = client.list()[object_id]
    assert listed["state"] == "created" and listed["data_size"] == 100
    assert listed["metadata_size"] == 4 and listed["ref_count"] == 1
    client.seal(object_id)
    del buffer
    assert client.contains(object_id)
    entry = client.list()[object_id]
    assert entry["state"] == "sealed"
    assert abs(entry["create_time"] - time.time()) < 60
    assert set(entry) == {"data_size", "metadata_size", "ref_count", "create_time",
                          "construct_duration", "state"}
    client.delete([object_id])
    assert not client.contains(object_id)
    client.delete([random_id()])  # missing objects are ignored, as in Plasma


def test_notifications(client):
    client.subscribe()
    object_ids = [random_id() for _ in range(3)]
    for i, object_id in enumerate(object_ids):
        client.create_and_seal(object_id, b"x" * (i + 1), b"m" * i)
    for i, object_id in enumerate(object_ids):
        assert client.get_next_notification() == (object_id, i + 1, i)
    client.delete([object_ids[0]])
    assert client.get_next_notification() == (object_ids[0], -1, -1)


def test_eviction(client):
    for _ in range(5):
        client.create_and_seal(random_id(), b"x" * 1_000_000)
    freed = client.evict(2_000_000)
    assert freed >= 2_000_000
    # A full store evicts unused objects by itself.
    for _ in range(200):
        client.create_and_seal(random_id(), b"y" * 1_000_000)
    assert len(client.list()) < 200


def test_record_batch_through_create_and_get_buffers(client):
    batch = pa.RecordBatch.from_arrays(
        [pa.array(np.arange(1000)), pa.array([str(i) for i in range(1000)])], ["n", "s"]
    )
    object_id = random_id()
    sizer = pa.MockOutputStream()
    with pa.RecordBatchStreamWriter(sizer, batch.schema) as writer:
        writer.write_batch(batch)
    buf = client.create(object_id, sizer.size())
    stream = pa.FixedSizeBufferWriter(buf)
    with pa.RecordBatchStreamWriter(stream, batch.schema) as writer:
        writer.write_batch(batch)
    client.seal(object_id)
    [data] = client.get_buffers([object_id])
    reader = pa.RecordBatchStreamReader(pa.BufferReader(data))
    read = reader.read_next_batch()
    assert read.equals(batch)
    # Zero copy: the column's values lie inside the object's buffer.
    values = read.column(0).buffers()[1]
    assert data.address <= values.address < data.address + data.size


def test_connect_retries_then_raises(workdir):
    started = time.monotonic()
    with pytest.raises(OSError):
        plasma.connect(str(workdir / "none.sock"), num_retries=3)
    assert time.monotonic() - started >= 0.2
