"""Skyriver from Python: a client of the local Skyriver daemon.

Objects are immutable bytes in the daemon's shared memory. ``put`` copies data in once;
``get`` returns read-only buffers over the shared memory itself, which numpy, memoryview and
pyarrow wrap without copying. An object stays referenced while any view of it lives.

    import skyriver, numpy as np
    with skyriver.connect() as client:              # the daemon at $SKYRIVER_SOCKET or the default
        oid = client.put_array(np.arange(10.0))
        print(client.get_array(oid).sum())          # a read-only array over shared memory

``skyriver.plasma`` is the pyarrow.plasma 11 API on Skyriver.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Optional, Union

from . import _native
from ._native import (
    OBJECT_ID_LEN,
    AlreadySealed,
    BadRequest,
    Buffer,
    ClientClosed,
    DaemonUnavailable,
    Event,
    FetchFailed,
    ForkedError,
    MutableBuffer,
    NotCreator,
    NotHeld,
    ObjectAborted,
    TooFewReplicas,
    ReplicasUnsupported,
    ObjectExists,
    ObjectID,
    ObjectInUse,
    ObjectNotFound,
    ObjectNotSealed,
    ObjectTooLarge,
    OutOfMemory,
    ProtocolError,
    SkyriverError,
    Subscription,
    Timeout,
    default_socket,
)

if TYPE_CHECKING:  # pragma: no cover
    import numpy
    import pyarrow

__version__ = _native.__version__

__all__ = [
    "OBJECT_ID_LEN",
    "AlreadySealed",
    "BadRequest",
    "Buffer",
    "Client",
    "ClientClosed",
    "DaemonUnavailable",
    "Event",
    "FetchFailed",
    "ForkedError",
    "MutableBuffer",
    "NotCreator",
    "NotHeld",
    "ObjectAborted",
    "TooFewReplicas",
    "ReplicasUnsupported",
    "ObjectExists",
    "ObjectID",
    "ObjectInUse",
    "ObjectNotFound",
    "ObjectNotSealed",
    "ObjectTooLarge",
    "OutOfMemory",
    "ProtocolError",
    "SkyriverError",
    "Subscription",
    "Timeout",
    "connect",
    "default_socket",
]

#: Metadata of objects written by ``put_array``: this prefix, then a JSON header.
ARRAY_METADATA_PREFIX = b"skyriver.ndarray/1\n"
#: Metadata of objects written by ``put_table``: an Arrow IPC stream.
TABLE_METADATA = b"skyriver.arrow-ipc-stream/1"

IdLike = Union[ObjectID, bytes]


def _tuplify(descr: Any) -> Any:
    """JSON turns a structured dtype's tuples into lists; numpy wants them back."""
    if isinstance(descr, list):
        return [tuple(_tuplify(part) for part in field) for field in descr]
    return descr


def _is_dataframe(value: Any) -> bool:
    """Whether ``value`` is a pandas DataFrame (without importing pandas when it is not loaded)."""
    import sys

    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(value, pandas.DataFrame)


class Client(_native.Client):
    """A connection to the local Skyriver daemon (see ``skyriver.connect``).

    Adds numpy and pyarrow conveniences to the native client: ``put_array``/``get_array``
    and ``put_table``/``get_table``.
    """

    def put_array(self, array: "numpy.ndarray", id: Optional[IdLike] = None) -> ObjectID:
        """Stores a numpy array (one copy, without the GIL) with its dtype and shape in the
        metadata; returns its id. Object arrays are refused (they hold pointers)."""
        import numpy as np

        array = np.asarray(array)
        if array.dtype.hasobject:
            raise TypeError("put_array cannot store arrays of Python objects (dtype=object)")
        fortran = array.ndim > 1 and array.flags.f_contiguous and not array.flags.c_contiguous
        data = array.T if fortran else np.ascontiguousarray(array)
        header = {
            "descr": np.lib.format.dtype_to_descr(array.dtype),
            "shape": list(array.shape),
            "fortran_order": bool(fortran),
        }
        metadata = ARRAY_METADATA_PREFIX + json.dumps(header).encode()
        # A zero-dimensional or empty array still has a (possibly empty) byte view.
        return self.put(data.reshape(-1).view(np.uint8), id=id, metadata=metadata)

    def get_array(self, id: IdLike, timeout: Optional[float] = None) -> "numpy.ndarray":
        """The array stored by ``put_array``: read-only, over the shared memory itself (no
        copy). It keeps the object referenced for as long as it (or a view of it) lives."""
        import numpy as np

        buffer = self.get(id, timeout=timeout)
        metadata = buffer.metadata
        if not metadata.startswith(ARRAY_METADATA_PREFIX):
            raise ValueError(f"object {id} was not stored by put_array (metadata {metadata[:32]!r})")
        header = json.loads(metadata[len(ARRAY_METADATA_PREFIX):])
        dtype = np.lib.format.descr_to_dtype(_tuplify(header["descr"]))
        shape = tuple(header["shape"])
        if buffer.size == 0:
            empty = np.empty(shape, dtype=dtype)  # nothing to share
            empty.flags.writeable = False
            return empty
        flat = np.frombuffer(buffer, dtype=dtype)
        if header["fortran_order"]:
            return flat.reshape(shape[::-1]).T
        return flat.reshape(shape)

    def put_table(
        self, table: "Union[pyarrow.Table, pyarrow.RecordBatch]", id: Optional[IdLike] = None
    ) -> ObjectID:
        """Stores a pyarrow Table (or RecordBatch, or pandas DataFrame, converted with
        ``pa.Table.from_pandas``) as an Arrow IPC stream written straight into shared memory;
        returns its id."""
        import pyarrow as pa

        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        elif not isinstance(table, pa.Table):
            if _is_dataframe(table):
                table = pa.Table.from_pandas(table)
            else:
                raise TypeError(
                    f"put_table takes a pyarrow.Table or RecordBatch (or a pandas DataFrame), "
                    f"got {type(table).__module__}.{type(table).__qualname__}; convert it with "
                    f"pa.Table.from_pandas(df), pa.table(dict_of_columns) or pa.Table.from_pylist(rows)"
                )
        oid = ObjectID(id) if isinstance(id, bytes) else (id or self.new_id())
        sizer = pa.MockOutputStream()
        with pa.ipc.new_stream(sizer, table.schema) as writer:
            writer.write_table(table)
        size = sizer.size()
        buffer = self.create(oid, size, metadata=TABLE_METADATA)
        try:
            sink = pa.FixedSizeBufferWriter(pa.py_buffer(buffer))
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            sink.close()
            del sink, writer
        except BaseException:
            buffer.release()
            raise
        buffer.seal()
        buffer.release()
        return oid

    def get_table(self, id: IdLike, timeout: Optional[float] = None) -> "pyarrow.Table":
        """The table stored by ``put_table``, read from shared memory without a copy: its
        columns reference the object, which stays referenced while they live."""
        import pyarrow as pa

        buffer = self.get(id, timeout=timeout)
        if buffer.metadata != TABLE_METADATA:
            raise ValueError(f"object {id} was not stored by put_table")
        return pa.ipc.open_stream(pa.py_buffer(buffer)).read_all()


def connect(socket: Union[str, "os.PathLike[str]", None] = None) -> Client:
    """Connects to the Skyriver daemon listening on ``socket`` (default: ``$SKYRIVER_SOCKET``,
    else ``/tmp/skyriver-<uid>/skyriver.sock``, as the CLI). Raises ``DaemonUnavailable`` (a
    ``ConnectionError``) naming the socket when no daemon listens there."""
    return Client(socket)
