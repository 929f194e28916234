"""The pyarrow.plasma 11 API on Skyriver.

Code written for Plasma runs after changing ``import pyarrow.plasma as plasma`` to
``import skyriver.plasma as plasma``, against a daemon started with plasma_store's flags::

    skyriver daemon -m 1000000000 -s /tmp/plasma

    import skyriver.plasma as plasma
    client = plasma.connect("/tmp/plasma")
    oid = plasma.ObjectID(20 * b"a")
    buf = client.create(oid, 1000)          # a mutable buffer in shared memory
    ...                                     # write into it
    client.seal(oid)
    [data] = client.get_buffers([oid])      # a zero-copy pyarrow.Buffer

Buffers are ``pyarrow.Buffer``s when pyarrow is installed (``skyriver.Buffer``s, which
support the buffer protocol, otherwise). The remaining differences from pyarrow.plasma are
listed in the README ("The pyarrow.plasma drop-in").
"""

from __future__ import annotations

import collections.abc
import json
import pickle
import socket as _socket
import struct
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import (
    ARRAY_METADATA_PREFIX,
    Client,
    ObjectExists,
    ObjectID,
    ObjectNotFound,
    OutOfMemory,
    ObjectTooLarge,
)

try:  # Buffers are pyarrow.Buffers where pyarrow is installed, as Plasma's were.
    import pyarrow as _pa
except ImportError:  # pragma: no cover - exercised only without pyarrow
    _pa = None

__all__ = [
    "ObjectID",
    "ObjectNotAvailable",
    "PlasmaBuffer",
    "PlasmaClient",
    "PlasmaObjectExists",
    "PlasmaObjectNotFound",
    "PlasmaStoreFull",
    "connect",
]

#: How many times ``connect(..., num_retries=-1)`` tries, 100 ms apart (as Plasma).
DEFAULT_CONNECT_RETRIES = 50

#: Metadata of objects written by ``PlasmaClient.put`` for values that are not arrays.
PICKLE_METADATA = b"skyriver.pickle/5"


class ObjectNotAvailable:
    """Placeholder returned by ``get`` for an object not available within the timeout."""


class PlasmaObjectExists(ObjectExists):
    """The object already exists (also a ``skyriver.ObjectExists``)."""


class PlasmaObjectNotFound(ObjectNotFound):
    """The object is not in the store (also a ``skyriver.ObjectNotFound``)."""


class PlasmaStoreFull(OutOfMemory):
    """The store is full even after eviction (also a ``skyriver.OutOfMemory``)."""


def _translate(error: BaseException) -> BaseException:
    if isinstance(error, ObjectExists):
        return PlasmaObjectExists(*error.args)
    if isinstance(error, ObjectNotFound):
        return PlasmaObjectNotFound(*error.args)
    if isinstance(error, (OutOfMemory, ObjectTooLarge)):
        return PlasmaStoreFull(*error.args)
    return error


class _Plasma_errors:
    """Re-raises Skyriver errors as the Plasma exceptions of the same meaning."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Optional[BaseException], trace: Any) -> bool:
        if error is not None:
            translated = _translate(error)
            if translated is not error:
                raise translated from error
        return False


_errors = _Plasma_errors()


def _wrap(buffer: Any) -> Any:
    """A pyarrow.Buffer over a Skyriver buffer (zero copy), where pyarrow is installed."""
    if _pa is None:
        return buffer
    return _pa.py_buffer(buffer)


#: What ``create`` and ``get_buffers`` return: ``pyarrow.Buffer`` where pyarrow is installed.
PlasmaBuffer = _pa.Buffer if _pa is not None else object


def _timeout_seconds(timeout_ms: int) -> Optional[float]:
    return None if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000.0


def _check_id(object_id: Any) -> ObjectID:
    if not isinstance(object_id, ObjectID):
        raise TypeError(f"expected an ObjectID, got {type(object_id).__name__}")
    return object_id


class PlasmaClient:
    """The client of pyarrow.plasma 11 (``PlasmaClient``), speaking to a Skyriver daemon."""

    def __init__(self, client: Client, store_socket_name: str) -> None:
        self._client = client
        self._socket_name = store_socket_name
        self._subscription: Any = None
        self._notification_pair: Optional[Tuple[_socket.socket, _socket.socket]] = None
        self._pump: Optional[threading.Thread] = None

    @property
    def store_socket_name(self) -> str:
        """The socket this client connected to."""
        return self._socket_name

    @property
    def client(self) -> Client:
        """The native ``skyriver.Client`` underneath (for its extra calls)."""
        return self._client

    def create(self, object_id: ObjectID, data_size: int, metadata: bytes = b"") -> Any:
        """Creates an object and returns a mutable buffer over its data; write it, then
        ``seal``. Raises ``PlasmaObjectExists`` or ``PlasmaStoreFull``."""
        with _errors:
            buffer = self._client.create(_check_id(object_id), data_size, metadata=metadata)
        return _wrap(buffer)

    def create_and_seal(self, object_id: ObjectID, data: bytes, metadata: bytes = b"") -> None:
        """Stores ``data`` (and ``metadata``) as a sealed object."""
        with _errors:
            self._client.put(data, id=_check_id(object_id), metadata=metadata)

    def seal(self, object_id: ObjectID) -> None:
        """Seals an object this client created: immutable, and visible to ``get``."""
        with _errors:
            self._client.seal(_check_id(object_id))

    def abort(self, object_id: ObjectID) -> None:
        """Drops an unsealed object this client created (its buffers must be gone)."""
        with _errors:
            self._client.abort(_check_id(object_id))

    def _get(self, object_ids: Sequence[ObjectID], timeout_ms: int) -> List[Any]:
        ids = [_check_id(object_id) for object_id in object_ids]
        with _errors:
            return self._client.get(ids, timeout=_timeout_seconds(timeout_ms))

    def get_buffers(
        self, object_ids: Sequence[ObjectID], timeout_ms: int = -1, with_meta: bool = False
    ) -> List[Any]:
        """Data buffers (zero copy, read-only) of the objects, ``None`` for those not
        available within ``timeout_ms`` (-1: wait for ever; 0: poll). With ``with_meta``,
        ``(metadata bytes, data buffer)`` tuples (``(None, None)`` when not available)."""
        result = []
        for buffer in self._get(object_ids, timeout_ms):
            if buffer is None:
                result.append((None, None) if with_meta else None)
            elif with_meta:
                result.append((buffer.metadata, _wrap(buffer)))
            else:
                result.append(_wrap(buffer))
        return result

    def get_metadata(self, object_ids: Sequence[ObjectID], timeout_ms: int = -1) -> List[Any]:
        """Metadata buffers (zero copy) of the objects, ``None`` where not available."""
        return [
            None if buffer is None else _wrap(buffer.metadata_buffer())
            for buffer in self._get(object_ids, timeout_ms)
        ]

    def put_raw_buffer(
        self,
        value: Any,
        object_id: Optional[ObjectID] = None,
        metadata: bytes = b"",
        memcopy_threads: int = 6,
    ) -> ObjectID:
        """Stores a copy of a buffer-protocol object; returns its id. (``memcopy_threads`` is
        accepted and ignored: one copy, without the GIL.)"""
        with _errors:
            return self._client.put(value, id=object_id, metadata=metadata)

    def put(
        self,
        value: Any,
        object_id: Optional[ObjectID] = None,
        memcopy_threads: int = 6,
        serialization_context: Any = None,
    ) -> ObjectID:
        """Stores a Python value; returns its id. numpy arrays are stored as ``put_array``
        does (read back zero-copy); other values are pickled (protocol 5)."""
        if serialization_context is not None:
            raise NotImplementedError(
                "serialization_context (pyarrow's deprecated serialization) is not supported"
            )
        if object_id is not None:
            _check_id(object_id)
        with _errors:
            try:
                import numpy as np
            except ImportError:  # pragma: no cover
                np = None
            if np is not None and type(value) is np.ndarray and not value.dtype.hasobject:
                return self._client.put_array(value, id=object_id)
            data = pickle.dumps(value, protocol=5)
            return self._client.put(data, id=object_id, metadata=PICKLE_METADATA)

    def get(
        self,
        object_ids: Union[ObjectID, Sequence[ObjectID]],
        timeout_ms: int = -1,
        serialization_context: Any = None,
    ) -> Any:
        """Values stored by ``put``: one id gives one value, a list a list;
        ``ObjectNotAvailable`` for objects not available within ``timeout_ms``."""
        if serialization_context is not None:
            raise NotImplementedError(
                "serialization_context (pyarrow's deprecated serialization) is not supported"
            )
        if not isinstance(object_ids, collections.abc.Sequence):
            return self.get([object_ids], timeout_ms)[0]
        results: List[Any] = []
        for object_id, buffer in zip(object_ids, self._get(object_ids, timeout_ms)):
            if buffer is None:
                results.append(ObjectNotAvailable)
            elif buffer.metadata.startswith(ARRAY_METADATA_PREFIX):
                buffer.release()
                results.append(self._client.get_array(object_id, timeout=0))
            elif buffer.metadata == PICKLE_METADATA:
                with memoryview(buffer) as view:
                    results.append(pickle.loads(view))
                buffer.release()
            else:
                # Raw bytes (create/seal, put_raw_buffer): the buffer itself, as Plasma's
                # deserializer would fail on them.
                results.append(_wrap(buffer))
        return results

    def contains(self, object_id: ObjectID) -> bool:
        """Whether a sealed object with this id is in the store."""
        return self._client.contains(_check_id(object_id))

    def delete(self, object_ids: Sequence[ObjectID]) -> None:
        """Deletes objects; ones in use go when released, missing ones are ignored."""
        self._client.delete([_check_id(object_id) for object_id in object_ids])

    def list(self) -> Dict[ObjectID, Dict[str, Any]]:
        """Every object: ``{id: {"data_size", "metadata_size", "ref_count", "create_time",
        "construct_duration", "state"}}`` as Plasma's ``list``."""
        now_ms = time.time() * 1000.0
        objects = self._client.list()
        newest_ms = max((o["created_ms"] for o in objects), default=0)
        result = {}
        for entry in objects:
            # The daemon reports creation on its own clock; anchor its newest object at now.
            age_s = (newest_ms - entry["created_ms"]) / 1000.0
            result[entry["id"]] = {
                "data_size": entry["data_size"],
                "metadata_size": entry["metadata_size"],
                "ref_count": entry["ref_count"],
                "create_time": int(now_ms / 1000.0 - age_s),
                "construct_duration": -1 if not entry["sealed"] else 0,
                "state": "sealed" if entry["sealed"] else "created",
            }
        return result

    def evict(self, num_bytes: int) -> int:
        """Evicts at least ``num_bytes`` of unused objects; returns the bytes freed."""
        return self._client.evict(num_bytes)["bytes"]

    def store_capacity(self) -> int:
        """The store's memory in bytes."""
        return self._client.stats()["capacity_bytes"]

    def hash(self, object_id: ObjectID) -> bytes:
        """Not provided: Skyriver does not hash objects."""
        raise NotImplementedError("PlasmaClient.hash is not provided by Skyriver")

    # Notifications. Plasma sent them over a socket; here a subscription (a connection of
    # its own) feeds `get_next_notification`, and `get_notification_socket` a socket pair.

    def subscribe(self) -> None:
        """Subscribes to seal and delete notifications."""
        if self._subscription is None:
            self._subscription = self._client.subscribe()

    def get_next_notification(self) -> Tuple[ObjectID, int, int]:
        """Waits for the next notification: ``(id, data_size, metadata_size)``, with sizes
        -1 for a deletion, as Plasma."""
        if self._subscription is None:
            raise RuntimeError("call subscribe() first")
        if self._pump is not None:
            raise RuntimeError("notifications go to the notification socket")
        event = self._subscription.next_event()
        if event is None:
            raise ConnectionError("the subscription was closed")
        return _as_notification(event)

    def get_notification_socket(self) -> _socket.socket:
        """A socket that receives notifications; read it and pass what arrives to
        ``decode_notifications``."""
        if self._subscription is None:
            raise RuntimeError("call subscribe() first")
        if self._notification_pair is None:
            ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
            self._notification_pair = (ours, theirs)
            self._pump = threading.Thread(
                target=_pump_notifications,
                args=(self._subscription, ours),
                name="skyriver-plasma-notifications",
                daemon=True,
            )
            self._pump.start()
        return self._notification_pair[1]

    def decode_notifications(self, buf: bytes) -> Tuple[List[ObjectID], List[int], List[int]]:
        """Decodes what the notification socket delivered: ``(ids, data_sizes,
        metadata_sizes)`` (sizes -1 for deletions)."""
        ids, data_sizes, metadata_sizes = [], [], []
        view = memoryview(buf)
        while len(view) >= _RECORD.size:
            raw_id, data_size, metadata_size = _RECORD.unpack_from(view)
            ids.append(ObjectID(bytes(raw_id)))
            data_sizes.append(data_size)
            metadata_sizes.append(metadata_size)
            view = view[_RECORD.size:]
        return ids, data_sizes, metadata_sizes

    def disconnect(self) -> None:
        """Disconnects; buffers already handed out stay valid until they go."""
        if self._subscription is not None:
            self._subscription.close()
        if self._notification_pair is not None:
            for end in self._notification_pair:
                end.close()
        self._client.close()

    def __enter__(self) -> "PlasmaClient":
        return self

    def __exit__(self, *args: Any) -> None:
        self.disconnect()


#: One notification on the notification socket: id, data size, metadata size.
_RECORD = struct.Struct("<20sqq")


def _as_notification(event: Any) -> Tuple[ObjectID, int, int]:
    if event.kind == "deleted":
        return event.id, -1, -1
    return event.id, event.data_size, event.metadata_size


def _pump_notifications(subscription: Any, sink: _socket.socket) -> None:
    try:
        for event in subscription:
            object_id, data_size, metadata_size = _as_notification(event)
            sink.sendall(_RECORD.pack(object_id.binary(), data_size, metadata_size))
    except OSError:
        pass  # the client disconnected


def connect(store_socket_name: str, num_retries: int = -1) -> PlasmaClient:
    """Connects to the daemon at ``store_socket_name``, trying ``num_retries`` times 100 ms
    apart (-1: 50 times, as Plasma). Raises ``skyriver.DaemonUnavailable`` (an ``OSError``)."""
    attempts = DEFAULT_CONNECT_RETRIES if num_retries < 0 else max(1, num_retries)
    for attempt in range(attempts):
        try:
            return PlasmaClient(Client(store_socket_name), store_socket_name)
        except ConnectionError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")
