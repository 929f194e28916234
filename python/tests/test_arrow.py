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


def test_put_table_takes_a_pandas_dataframe(client):
    pd = pytest.importorskip("pandas", reason="pandas is not installed")
    frame = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    got = client.get_table(client.put_table(frame))
    assert got.column("a").to_pylist() == [1, 2, 3]
    assert got.to_pandas()[["a", "b"]].equals(frame)


@pytest.mark.parametrize("wrong", [{"a": [1, 2]}, [1, 2, 3], b"bytes"])
def test_put_table_of_something_else_names_the_conversion(client, wrong):
    with pytest.raises(TypeError, match=r"pa\.Table\.from_pandas"):
        client.put_table(wrong)
