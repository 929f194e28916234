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

import collections
import collections.abc
import contextlib
import hashlib
import os
import pickle
import shutil
import signal
import socket as _socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import (
    ARRAY_METADATA_PREFIX,
    Client,
    ObjectExists,
    ObjectNotFound,
    ObjectNotSealed,
    OutOfMemory,
    ObjectTooLarge,
    Timeout,
    _native,
)
from . import _plasma_notifications as _notifications

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
    "start_plasma_store",
]

#: How many times ``connect(..., num_retries=-1)`` tries, 100 ms apart (as Plasma).
DEFAULT_CONNECT_RETRIES = 50

#: Metadata of objects written by ``PlasmaClient.put`` for values that are not arrays.
PICKLE_METADATA = b"skyriver.pickle/5"


#: Bytes of the digest ``PlasmaClient.hash`` returns (Plasma's ``kDigestSize``).
DIGEST_SIZE = 8


class ObjectID(_native.ObjectID):
    """A 20-byte object id: ``skyriver.ObjectID`` that refuses anything but 20 bytes with
    ``ValueError``, as Plasma's ``ObjectID`` (``ObjectID("hello")`` included)."""

    def __new__(cls, object_id: Any) -> "ObjectID":
        if not isinstance(object_id, bytes) or len(object_id) != _native.OBJECT_ID_LEN:
            raise ValueError("Object ID must by 20 bytes, is " + str(object_id))
        return super().__new__(cls, object_id)

    @staticmethod
    def from_random() -> "ObjectID":
        """A random id (from the operating system)."""
        return ObjectID(os.urandom(_native.OBJECT_ID_LEN))


class ObjectNotAvailable:
    """Placeholder returned by ``get`` for an object not available within the timeout."""


#: Plasma's errors derived from pyarrow's ``ArrowException``: so do these where pyarrow is
#: installed, besides Skyriver's own classes.
_ARROW_EXCEPTION: Tuple[type, ...] = (_pa.lib.ArrowException,) if _pa is not None else ()


class PlasmaObjectExists(ObjectExists, *_ARROW_EXCEPTION):  # type: ignore[misc]
    """The object already exists (also a ``skyriver.ObjectExists`` and, with pyarrow, a
    ``pyarrow.lib.ArrowException``)."""


class PlasmaObjectNotFound(ObjectNotFound, *_ARROW_EXCEPTION):  # type: ignore[misc]
    """The object is not in the store (also a ``skyriver.ObjectNotFound`` and, with
    pyarrow, a ``pyarrow.lib.ArrowException``)."""


class PlasmaStoreFull(OutOfMemory, *_ARROW_EXCEPTION):  # type: ignore[misc]
    """The store is full even after eviction (also a ``skyriver.OutOfMemory`` and, with
    pyarrow, a ``pyarrow.lib.ArrowException``)."""


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
    if not isinstance(object_id, _native.ObjectID):
        raise TypeError(f"expected an ObjectID, got {type(object_id).__name__}")
    return object_id


class PlasmaClient:
    """The client of pyarrow.plasma 11 (``PlasmaClient``), speaking to a Skyriver daemon."""

    def __init__(self, client: Client, store_socket_name: str) -> None:
        self._client = client
        self._socket_name = store_socket_name
        self._subscription: Any = None
        #: Sealed objects that were in the store at `subscribe()`: notified first, as Plasma.
        self._backlog: Deque[Tuple[ObjectID, int, int]] = collections.deque()
        self._notification_pair: Optional[Tuple[_socket.socket, _socket.socket]] = None
        self._pump: Optional[threading.Thread] = None
        #: Notifications read from the socket by `get_next_notification`, not yet returned.
        self._unread: Deque[Tuple[ObjectID, int, int]] = collections.deque()
        #: Unix times (create, seal) of the objects this client created, for `list()`.
        self._times: Dict[_native.ObjectID, Tuple[float, Optional[float]]] = {}

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
        self._times[object_id] = (time.time(), None)
        return _wrap(buffer)

    def create_and_seal(self, object_id: ObjectID, data: bytes, metadata: bytes = b"") -> None:
        """Stores ``data`` (and ``metadata``) as a sealed object."""
        with _errors:
            self._client.put(data, id=_check_id(object_id), metadata=metadata)

    def seal(self, object_id: ObjectID) -> None:
        """Seals an object this client created: immutable, and visible to ``get``."""
        with _errors:
            self._client.seal(_check_id(object_id))
        created = self._times.get(object_id)
        if created is not None:
            self._times[object_id] = (created[0], time.time())

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

    def _new_id(self) -> ObjectID:
        """The id of a put that names none: random, as Plasma's, but naming this node, so
        another node's first fetch of it asks this one directly (see ``Client.new_id``)."""
        return ObjectID(self._client.new_id().binary())

    def put_raw_buffer(
        self,
        value: Any,
        object_id: Optional[ObjectID] = None,
        metadata: bytes = b"",
        memcopy_threads: int = 6,
    ) -> ObjectID:
        """Stores a copy of a buffer-protocol object; returns its id. (``memcopy_threads`` is
        accepted and ignored: one copy, without the GIL.)"""
        target = _check_id(object_id) if object_id is not None else self._new_id()
        with _errors:
            self._client.put(value, id=target, metadata=metadata)
        return target

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
        target = _check_id(object_id) if object_id is not None else self._new_id()
        with _errors:
            np = sys.modules.get("numpy")
            if np is not None and type(value) is np.ndarray and not value.dtype.hasobject:
                self._client.put_array(value, id=target)
            else:
                data = pickle.dumps(value, protocol=5)
                self._client.put(data, id=target, metadata=PICKLE_METADATA)
        return target

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
        "construct_duration", "state"}}`` as Plasma's ``list``: ``create_time`` in Unix
        seconds and ``construct_duration`` in whole seconds from create to seal (-1 while
        unsealed)."""
        now = time.time()
        objects = self._client.list()
        newest_ms = max((o["created_ms"] for o in objects), default=0)
        result = {}
        for entry in objects:
            object_id = ObjectID(entry["id"].binary())
            times = self._times.get(object_id)
            if times is not None:
                created, sealed = times
            else:
                # Another client's object: the daemon reports creation on its own clock;
                # anchor its newest object at now.
                created = now - (newest_ms - entry["created_ms"]) / 1000.0
                sealed = created if entry["sealed"] else None
            if entry["sealed"] and sealed is None:
                sealed = now  # sealed through the native client: at the latest now
            create_time = int(created)
            result[object_id] = {
                "data_size": entry["data_size"],
                "metadata_size": entry["metadata_size"],
                "ref_count": entry["ref_count"],
                "create_time": create_time,
                # Whole seconds on the wall clock, as Plasma's time(NULL) differences.
                "construct_duration": int(sealed) - create_time if entry["sealed"] else -1,
                "state": "sealed" if entry["sealed"] else "created",
            }
        live = set(result)
        for object_id in [known for known in self._times if known not in live]:
            del self._times[object_id]
        return result

    def evict(self, num_bytes: int) -> int:
        """Evicts at least ``num_bytes`` of unused objects, least recently used first;
        returns the data and metadata bytes of the objects evicted, as Plasma."""
        before = {o["id"]: o for o in self._client.list() if o["sealed"]}
        outcome = self._client.evict(num_bytes)
        if outcome["objects"] == 0:
            return 0
        after = {o["id"] for o in self._client.list()}
        return sum(
            entry["data_size"] + entry["metadata_size"]
            for object_id, entry in before.items()
            if object_id not in after
        )

    def store_capacity(self) -> int:
        """The store's memory in bytes (plasma_store's ``-m``)."""
        return self._client.stats()["capacity_bytes"]

    def hash(self, object_id: ObjectID) -> bytes:
        """An 8-byte digest of the object's data and metadata (equal for equal contents), as
        Plasma's; raises ``PlasmaObjectNotFound`` when the object is not in the store."""
        try:
            buffer = self._client.get(_check_id(object_id), timeout=0)
        except (Timeout, ObjectNotFound, ObjectNotSealed) as error:
            raise PlasmaObjectNotFound(f"object {object_id} is not in the store") from error
        with buffer:
            digest = hashlib.blake2b(digest_size=DIGEST_SIZE)
            with memoryview(buffer) as data:
                digest.update(data)
            digest.update(buffer.metadata)
        return digest.digest()

    def set_client_options(self, client_name: str, limit_output_memory: int) -> None:
        """Not provided: Skyriver has no per-client memory quota."""
        raise NotImplementedError("set_client_options: Skyriver has no per-client memory quota")

    def debug_string(self) -> str:
        """The store's counters, one ``name: value`` a line (Plasma's lines differ)."""
        return "".join(f"{name}: {value}\n" for name, value in self._client.stats().items())

    # Notifications. Plasma's store wrote them to a socket: an 8-byte length, then a
    # flatbuffers `PlasmaNotification`. Here a subscription (a connection of its own) feeds
    # `get_next_notification`, or a thread that writes the same messages to a socket pair.

    def subscribe(self) -> None:
        """Subscribes to seal and delete notifications. The sealed objects already in the
        store are notified first, as Plasma did."""
        if self._subscription is None:
            self._subscription = self._client.subscribe()
            self._backlog.extend(
                (ObjectID(o["id"].binary()), o["data_size"], o["metadata_size"])
                for o in self._client.list()
                if o["sealed"]
            )

    def get_next_notification(self) -> Tuple[ObjectID, int, int]:
        """Waits for the next notification: ``(id, data_size, metadata_size)``, with sizes
        -1 for a deletion, as Plasma."""
        if self._subscription is None:
            raise RuntimeError("call subscribe() first")
        if self._notification_pair is not None:
            # As Plasma: read from the notification socket (which the caller may read too).
            while not self._unread:
                message = _notifications.read_message(self._notification_pair[1])
                self._unread.extend(zip(*self.decode_notifications(message)))
            return self._unread.popleft()
        if self._backlog:
            return self._backlog.popleft()
        event = self._subscription.next_event()
        if event is None:
            raise ConnectionError("the subscription was closed")
        return _as_notification(event)

    def get_notification_socket(self) -> _socket.socket:
        """The notification socket: each notification is an 8-byte length (native byte
        order), then a flatbuffers ``PlasmaNotification`` that ``decode_notifications``
        decodes, as Plasma's store wrote them."""
        if self._subscription is None:
            raise RuntimeError("call subscribe() first")
        if self._notification_pair is None:
            ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
            self._notification_pair = (ours, theirs)
            backlog = list(self._backlog)
            self._backlog.clear()
            self._pump = threading.Thread(
                target=_pump_notifications,
                args=(self._subscription, backlog, ours),
                name="skyriver-plasma-notifications",
                daemon=True,
            )
            self._pump.start()
        return self._notification_pair[1]

    def decode_notifications(self, buf: bytes) -> Tuple[List[ObjectID], List[int], List[int]]:
        """Decodes one message of the notification socket (without its length):
        ``(ids, data_sizes, metadata_sizes)``, sizes -1 for deletions."""
        ids, data_sizes, metadata_sizes = [], [], []
        for info in _notifications.decode(bytes(buf)):
            ids.append(ObjectID(info.object_id))
            data_sizes.append(-1 if info.is_deletion else info.data_size)
            metadata_sizes.append(-1 if info.is_deletion else info.metadata_size)
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


def _as_notification(event: Any) -> Tuple[ObjectID, int, int]:
    object_id = ObjectID(event.id.binary())
    if event.kind == "deleted":
        return object_id, -1, -1
    return object_id, event.data_size, event.metadata_size


def _pump_notifications(
    subscription: Any, backlog: List[Tuple[ObjectID, int, int]], sink: _socket.socket
) -> None:
    def send(object_id: ObjectID, data_size: int, metadata_size: int) -> None:
        deleted = data_size < 0
        info = _notifications.ObjectInfo(
            object_id=object_id.binary(),
            data_size=0 if deleted else data_size,
            metadata_size=0 if deleted else metadata_size,
            is_deletion=deleted,
        )
        sink.sendall(_notifications.frame(_notifications.encode([info])))

    try:
        for notification in backlog:
            send(*notification)
        for event in subscription:
            send(*_as_notification(event))
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


def _wait_for_socket(path: str, process: "subprocess.Popen[bytes]", deadline: float) -> None:
    while True:
        try:
            Client(path).close()
            return
        except ConnectionError:
            code = process.poll()
            if code is not None:
                raise RuntimeError(f"plasma_store exited unexpectedly with code {code}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"plasma_store did not serve {path} in time")
            time.sleep(0.02)


@contextlib.contextmanager
def start_plasma_store(
    plasma_store_memory: int,
    use_valgrind: bool = False,
    use_profiler: bool = False,
    plasma_directory: Optional[str] = None,
    use_hugepages: bool = False,
    external_store: Optional[str] = None,
    spill_limit: Optional[int] = None,
) -> Iterator[Tuple[str, "subprocess.Popen[bytes]"]]:
    """Starts a store (``plasma_store -m plasma_store_memory -s <temporary socket>``, the
    Skyriver daemon), yields ``(socket name, process)`` once it serves, and stops it at the
    end of the ``with`` block, as pyarrow.plasma's ``start_plasma_store``.

    ``plasma_directory``/``use_hugepages`` are ``-d``/``-h``; ``external_store`` (``-e``)
    ``file://DIR`` spills evicted objects to DIR (the daemon's ``--spill-dir``), at most
    ``spill_limit`` bytes of them (the daemon's ``--spill-limit``; default: 90% of the free
    space of DIR's file system). The daemon runs from this package (the ``plasma_store``
    command of its wheel), through the running interpreter."""
    if use_valgrind and use_profiler:
        raise Exception("Cannot use valgrind and profiler at the same time.")
    if use_valgrind or use_profiler:
        raise NotImplementedError("the Skyriver daemon is not run under valgrind here")
    if spill_limit is not None and external_store is None:
        raise ValueError("spill_limit needs an external_store (file://DIR) to spill to")
    tmpdir = tempfile.mkdtemp(prefix="test_plasma-")
    proc: "Optional[subprocess.Popen[bytes]]" = None
    try:
        plasma_store_name = os.path.join(tmpdir, "plasma.sock")
        command = [
            sys.executable, "-m", "skyriver._cli", "plasma_store",
            "-s", plasma_store_name,
            "-m", str(plasma_store_memory),
        ]
        if plasma_directory:
            command += ["-d", plasma_directory]
        if use_hugepages:
            command += ["-h"]
        if external_store is not None:
            command += ["-e", external_store]
        if spill_limit is not None:
            # plasma_store has no such flag: it goes to the daemon after `--`.
            command += ["--", "--spill-limit", str(spill_limit)]
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        _wait_for_socket(plasma_store_name, proc, time.monotonic() + 60)
        yield plasma_store_name, proc
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the daemon stops and removes its socket
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmpdir, ignore_errors=True)
