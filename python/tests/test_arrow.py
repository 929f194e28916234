"""Tables through shared memory (pyarrow)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")


def test_put_table_and_get_table_without_a_copy(client):
    table = pa.table({"x": np.arange(100_000, dtype=np.int64), "y": [str(i % 7) for i in range(100_000)]})
    oid = client.put_table(table)
    got = client.get_table(oid)
    assert got.equals(table)
    object_buffer = client.get(oid)
    values = got.column("x").chunk(0).buffers()[1]
    assert object_buffer.address <= values.address < object_buffer.address + object_buffer.size
    # The table keeps the object referenced; the reference goes with it.
    object_buffer.release()
    client.flush()
    assert [e["ref_count"] for e in client.list() if e["id"] == oid] == [1]
    del got, values
    gc.collect()
    client.flush()
    assert [e["ref_count"] for e in client.list() if e["id"] == oid] == [0]


def test_record_batches_and_py_buffer_views(client):
    batch = pa.RecordBatch.from_arrays([pa.array([1.0, 2.0])], ["v"])
    oid = client.put_table(batch)
    assert client.get_table(oid).to_pydict() == {"v": [1.0, 2.0]}
    buffer = client.get(client.put(b"abcdef"))
    wrapped = pa.py_buffer(buffer)
    assert wrapped.address == buffer.address and not wrapped.is_mutable
    assert wrapped.to_pybytes() == b"abcdef"
