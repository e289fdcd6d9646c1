"""The data path between gateways and shards: one TCP connection per (gateway, shard),
many calls multiplexed on it, msgpack frames, on plain asyncio protocols (no stream
readers, no task per frame on the hot path).

Ray places the shard processes, restarts them and tells a gateway where a shard listens
(``ShardActor.address``); the commands themselves do not go through Ray calls. Measured here
(loadtest/RESULTS.md, "Data path"): under load a Ray actor call added ~4.7 ms to each batch
whose work in the shard took 2.2 ms, most of it serialisation and thread hand-offs in both
processes; this channel adds a fraction of a millisecond.

Frames are a 4-byte little-endian length and a msgpack body. A connection starts with the
handshake of :mod:`actors.handshake`: the shard's ``Challenge``, the gateway's ``Hello``, the
shard's ``Welcome``; each end proves the cluster secret (``EVQ_CLUSTER_SECRET``, or made per
embedded ``evq serve``; given to every shard at spawn) without sending it, and a connection
that does not is refused and logged. Unless both ends are on loopback and the shard allows it
(the embedded server), every frame after the handshake is sealed (ChaCha20-Poly1305, keys of
this connection only). Then requests (``Batch``, ``TakeWait``, ``Cancel``, …) and replies
(``Reply``) with request ids, answered in any order. A ``Batch`` carries ``(queue, command)``
items for any queues of the shard: the shard decides them all at once, so they share one
group commit, and answers with one frame when all are durable. Each result is ``[0, reply]``
or ``[1, error]`` and is decoded by the gateway with the reply type of its command.

A connection that breaks fails every call in flight on it with ``Unavailable`` (the call may
or may not have happened, as with any lost reply); the next call reconnects, asking Ray for
the shard's address again (it changes when Ray restarts the shard). A connection that goes
silent does the same: when calls wait on it and nothing came for ``PING_AFTER_S``, the
gateway asks the shard for its status (a request every version answers at once); nothing
for ``SILENT_S`` after that, and the connection is dropped. So a shard process that is
paused, or whose node is cut off, while Ray starts it again elsewhere does not hold its
calls for ever: they fail, and the retries reach the new incarnation.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, cast

import msgspec

from actors import errors as _errors
from actors import handshake
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.errors import QueueError, Unavailable
from actors.flow import Call
from actors.history import Sample
from actors.metrics import QueueMetrics
from actors.settings import QueueSettings
from actors.status import ShardStatus

__all__ = [
    "CALLS_IN_FLIGHT",
    "IN_FLIGHT_PER_CONNECTION",
    "PUT_BYTES_PER_CALL",
    "ChannelClient",
    "ChannelServer",
]

# What a gateway sends a shard at once (gateway/batcher.py): calls in flight per shard, each
# with about this many bytes of put bodies at most (one bigger put goes alone).
CALLS_IN_FLIGHT = 2
PUT_BYTES_PER_CALL = 4 << 20
# What one gateway connection can make a shard hold before it can refuse a put: its calls'
# frames and their decoded bodies (the shard's memory budget keeps that much room).
IN_FLIGHT_PER_CONNECTION = 2 * CALLS_IN_FLIGHT * PUT_BYTES_PER_CALL

log = logging.getLogger(__name__)

_LEN = struct.Struct("<I")
MAX_FRAME = 1 << 30
# A silent connection (see the module docstring): when to ask, when to give up, how often
# to look.
HANDSHAKE_S = 10.0  # a gateway that has not proved the secret by then is dropped
PING_AFTER_S = 2.0
SILENT_S = 10.0
WATCH_EVERY_S = 1.0


# The handshake (actors/handshake.py): frames in a fixed order, so only Hello is tagged
class Challenge(msgspec.Struct, array_like=True):
    key: bytes  # the shard's ephemeral X25519 public key
    encrypt: bool  # whether the frames after the handshake are sealed


class Hello(msgspec.Struct, array_like=True, tag=True):
    key: bytes  # the gateway's ephemeral X25519 public key
    proof: bytes


class Welcome(msgspec.Struct, array_like=True):
    proof: bytes


class Batch(msgspec.Struct, array_like=True, tag=True):
    rid: int
    items: list[tuple[str, cmd.Command]]


class TakeWait(msgspec.Struct, array_like=True, tag=True):
    rid: int
    queue: str
    take: cmd.Take
    wait_s: float


class Cancel(msgspec.Struct, array_like=True, tag=True):
    rid: int


class CreateQueue(msgspec.Struct, array_like=True, tag=True):
    rid: int
    name: str
    settings: QueueSettings
    given: list[str]


class DeleteQueue(msgspec.Struct, array_like=True, tag=True):
    rid: int
    name: str


class Names(msgspec.Struct, array_like=True, tag=True):
    rid: int


class Status(msgspec.Struct, array_like=True, tag=True):
    rid: int
    brief: bool = False  # appended: without the queues' recovery reports


class Metrics(msgspec.Struct, array_like=True, tag=True):
    rid: int


class History(msgspec.Struct, array_like=True, tag=True):
    """A queue's counts over the last hour (actors/history.py)."""

    rid: int
    queue: str


class WatchKey(msgspec.Struct, array_like=True, tag=True):
    """One-shot: answered when ``key`` is past ``version`` (or cancelled)."""

    rid: int
    key: str
    version: int


class Reply(msgspec.Struct, array_like=True):
    """Results as the gateway reads them: each still encoded, decoded by its command's type."""

    rid: int
    items: list[tuple[int, msgspec.Raw]]


class _Results(msgspec.Struct, array_like=True):
    """A :class:`Reply` as the shard writes it: the results themselves, encoded in one go."""

    rid: int
    items: list[tuple[int, Any]]


class ErrorWire(msgspec.Struct, array_like=True):
    code: str
    message: str
    fields: dict[str, Any]


Request = (
    Hello
    | Batch
    | TakeWait
    | Cancel
    | CreateQueue
    | DeleteQueue
    | Names
    | Status
    | WatchKey
    | Metrics
    | History
)

_encoder = msgspec.msgpack.Encoder()
_request_decoder: msgspec.msgpack.Decoder[Request] = msgspec.msgpack.Decoder(Request)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_error_decoder = msgspec.msgpack.Decoder(ErrorWire)
_challenge_decoder = msgspec.msgpack.Decoder(Challenge)
_welcome_decoder = msgspec.msgpack.Decoder(Welcome)

# The reply type of each command, to decode its result.
_REPLY_TYPES: dict[type, Any] = {
    cmd.Create: bool,
    cmd.ChangeSettings: QueueSettings,
    cmd.PatchSettings: QueueSettings,
    cmd.Describe: rp.Description,
    cmd.Put: list[rp.PutResult],
    cmd.Take: list[rp.Delivery],
    cmd.Ack: list[rp.ItemResult],
    cmd.Release: list[rp.ItemResult],
    cmd.Touch: list[rp.ItemResult],
    cmd.Update: rp.MessageView,
    cmd.Reschedule: rp.MessageView,
    cmd.Peek: rp.MessageView,
    cmd.PeekReady: list[rp.MessageView],
    cmd.Browse: rp.BrowsePage,
    cmd.Delete: None,
    cmd.Purge: int,
    cmd.Pause: bool,
    cmd.Stats: rp.StatsView,
    cmd.ConfirmDeadLetters: int,
    cmd.SetKey: rp.KeyView,
    cmd.GetKey: rp.KeyView,
    cmd.Checkpoint: None,
    cmd.HandOver: None,
    cmd.TakeOver: None,
    cmd.MoveBodies: int,
    cmd.Drop: None,
    cmd.StartMove: rp.MoveTask,
    cmd.CancelMove: int,
    cmd.ListMoves: list[rp.MoveTask],
    cmd.MoveProgress: None,
    cmd.EndMove: None,
}
_REPLY_TYPES.update(
    {
        CreateQueue: tuple[bool, QueueSettings],
        DeleteQueue: None,
        Names: list[str],
        Status: ShardStatus,
        WatchKey: rp.KeyView,
        Metrics: list[QueueMetrics],
        History: list[Sample],
    }
)
_reply_decoders = {k: msgspec.msgpack.Decoder(v) for k, v in _REPLY_TYPES.items()}
_ERROR_CLASSES: dict[str, type[QueueError]] = {
    cls.code: cls
    for cls in vars(_errors).values()
    if isinstance(cls, type) and issubclass(cls, QueueError) and cls is not QueueError
}


def _frame(body: bytes) -> bytes:
    return _LEN.pack(len(body)) + body


class _Frames:
    """Cuts a byte stream into frames (a 4-byte little-endian length, then the body)."""

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> list[bytes]:
        """The frames completed by ``data``.

        Raises:
            ConnectionError: a frame over the size limit.
        """
        buf = self._buf
        buf += data
        frames = []
        pos, end = self._pos, len(buf)
        while end - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if size > MAX_FRAME:
                raise ConnectionError(f"frame of {size} bytes over the limit")
            if end - pos - 4 < size:
                break
            frames.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos == end:
            buf.clear()
            pos = 0
        elif pos > 65536:
            del buf[:pos]
            pos = 0
        self._pos = pos
        return frames


def _result_item(result: Any) -> tuple[int, Any]:
    if isinstance(result, QueueError):
        return (1, ErrorWire(result.code, result.message, _plain(result.fields)))
    return (0, result)


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    """Error fields msgpack can carry (anything else as its repr)."""
    ok = (str, int, float, bool, type(None))
    return {k: v if isinstance(v, ok) else repr(v) for k, v in fields.items()}


def _decode_result(item: tuple[int, msgspec.Raw], command_type: type) -> Any:
    flag, raw = item
    if flag:
        wire = _error_decoder.decode(raw)
        cls = _ERROR_CLASSES.get(wire.code, _errors.InternalError)
        return cls(wire.message, **wire.fields)
    return _reply_decoders[command_type].decode(raw)


# ------------------------------------------------------------------ shard side


class Service(Protocol):
    """What a shard offers gateways (errors may be raised or returned as values)."""

    def begin(self, items: Sequence[tuple[str, object]]) -> Call | None: ...
    async def run_batch(self, items: Sequence[tuple[str, object]]) -> list[Any]: ...
    async def take(self, queue: str, command: cmd.Take, wait_s: float) -> Any: ...
    async def create(
        self, name: str, settings: QueueSettings, given: list[str]
    ) -> tuple[bool, QueueSettings]: ...
    async def delete(self, name: str) -> None: ...
    async def names(self) -> list[str]: ...
    def status(self, brief: bool = False) -> ShardStatus: ...
    async def watch_key(self, key: str, version: int) -> rp.KeyView: ...
    async def metrics(self) -> list[QueueMetrics]: ...
    async def history(self, name: str) -> list[Sample]: ...


class ChannelServer:
    """Serves one shard to gateways over TCP."""

    def __init__(self, service: Service, secret: str, *, encrypt: bool | None = None) -> None:
        """``encrypt``: seal every connection's frames (True), or all but those whose two
        ends are on loopback (None, the embedded server's choice)."""
        self._service = service
        self._secret = secret
        self._encrypt = encrypt
        self.refused = 0  # connections that did not prove the secret
        self._server: asyncio.Server | None = None
        self._connections: set[_ServerConnection] = set()

    @property
    def connections(self) -> int:
        """Gateway connections open now."""
        return len(self._connections)

    async def start(self, host: str, port: int = 0) -> tuple[str, int]:
        """Listen; return the address gateways should connect to."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ServerConnection(self), host, port, backlog=256
        )
        sock = self._server.sockets[0]
        return host, int(sock.getsockname()[1])

    async def close(self) -> None:
        """Stop listening and drop the connections."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()


class _ServerConnection(asyncio.Protocol):
    """One gateway's connection: frames in, calls answered in any order."""

    def __init__(self, server: ChannelServer) -> None:
        self.server = server
        self.service = server._service
        self.transport: asyncio.Transport | None = None
        self.frames = _Frames()
        self.handshake: handshake.Server | None = None  # until the gateway proved the secret
        self.sealer: handshake.Sealed | None = None
        self.opener: handshake.Sealed | None = None
        self.calls: dict[int, asyncio.Task[None]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # typeshed types it BaseTransport for every protocol; a stream's is a Transport
        self.transport = transport  # type: ignore[assignment]
        self.server._connections.add(self)
        encrypt = self.server._encrypt
        if encrypt is None:
            ends = (transport.get_extra_info("sockname"), transport.get_extra_info("peername"))
            encrypt = not handshake.on_loopback(*ends)
        self.handshake = handshake.Server(self.server._secret, encrypt)
        self.transport.write(  # type: ignore[union-attr]
            _frame(_encoder.encode(Challenge(self.handshake.public, encrypt)))
        )
        self._timer = asyncio.get_running_loop().call_later(
            HANDSHAKE_S, self._refuse, "no proof of the secret in time"
        )

    def _refuse(self, why: str) -> None:
        self.server.refused += 1
        log.warning(
            "channel: refused a connection from %s: %s (EVQ_CLUSTER_SECRET differs?)",
            self.transport.get_extra_info("peername") if self.transport else None,
            why,
        )
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        for call in list(self.calls.values()):
            call.cancel()  # the gateway went away: its waiting calls end with it
        self.transport = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.frames.feed(data)
        except ConnectionError as exc:
            self._refuse(str(exc)) if self.handshake else self._drop(exc)
            return
        for frame in frames:
            if self.transport is None or self.transport.is_closing():
                return
            if self.handshake is not None:
                self._hello(frame)
                continue
            try:
                if self.opener is not None:
                    frame = self.opener.open(frame)
                request = _request_decoder.decode(frame)
            except (ConnectionError, msgspec.DecodeError, UnicodeDecodeError) as exc:
                self._drop(exc)
                return
            self._handle(request)

    def _drop(self, exc: Exception) -> None:
        log.warning("channel: dropping a connection that spoke nonsense: %s", exc)
        if self.transport is not None:
            self.transport.abort()

    def _hello(self, frame: bytes) -> None:
        """The gateway's first frame: its proof of the secret, or the connection's end."""
        shake = self.handshake
        assert shake is not None
        assert self.transport is not None
        try:
            hello = _request_decoder.decode(frame)
            if not isinstance(hello, Hello):
                raise handshake.Refused(f"{type(hello).__name__} before the handshake")
            proof, self.sealer, self.opener = shake.accept(hello.key, hello.proof)
        except (handshake.Refused, msgspec.DecodeError, UnicodeDecodeError) as exc:
            self._refuse(str(exc) or type(exc).__name__)
            return
        self.handshake = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.transport.write(_frame(_encoder.encode(Welcome(proof))))

    def _handle(self, request: Any) -> None:
        if isinstance(request, Hello):
            self._drop(ConnectionError("a second Hello"))
            return
        if isinstance(request, Batch):
            call = self.service.begin(request.items)
            if call is not None:  # the hot path: decided now, answered when durable
                rid = request.rid
                call.on_done(lambda results: self._reply(rid, results))
                return
        elif isinstance(request, Cancel):
            task = self.calls.get(request.rid)
            if task is not None:
                task.cancel()
            return
        rid = request.rid
        task = asyncio.ensure_future(self._answer(request))
        self.calls[rid] = task
        task.add_done_callback(lambda _: self.calls.pop(rid, None))

    async def _answer(self, request: Any) -> None:
        n = len(request.items) if isinstance(request, Batch) else 1
        try:
            results = await self._dispatch(request)
        except asyncio.CancelledError:
            return
        except Exception as exc:  # an answer always goes back, or the gateway would wait forever
            if not isinstance(exc, QueueError):
                log.exception("channel: a call failed in the shard")
                exc = _errors.InternalError(f"shard call failed: {type(exc).__name__}")
            results = [exc] * n
        self._reply(request.rid, results)

    def _reply(self, rid: int, results: list[Any]) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            body = _encoder.encode(_Results(rid, [_result_item(r) for r in results]))
            if self.sealer is not None:
                body = self.sealer.seal(body)
            transport.write(_frame(body))

    async def _dispatch(self, request: Any) -> list[Any]:
        service = self.service
        if isinstance(request, Batch):
            return await service.run_batch(request.items)
        if isinstance(request, TakeWait):
            return [await service.take(request.queue, request.take, request.wait_s)]
        if isinstance(request, WatchKey):
            return [await service.watch_key(request.key, request.version)]
        if isinstance(request, CreateQueue):
            return [await service.create(request.name, request.settings, request.given)]
        if isinstance(request, DeleteQueue):
            await service.delete(request.name)
            return [None]
        if isinstance(request, Names):
            return [await service.names()]
        if isinstance(request, Status):
            return [service.status(request.brief)]
        if isinstance(request, Metrics):
            return [await service.metrics()]
        if isinstance(request, History):
            return [await service.history(request.queue)]
        raise _errors.BadRequest(f"unknown request {type(request).__name__}")


# ------------------------------------------------------------------ gateway side


class ChannelClient:
    """A gateway's connection to one shard."""

    def __init__(self, address: Callable[[], Awaitable[tuple[str, int]]], secret: str) -> None:
        self._address = address  # asks Ray where the shard listens now
        self._secret = secret
        self._connection: _ClientConnection | None = None
        self._rids = itertools.count(1)
        self._connecting: asyncio.Lock | None = None
        self._connecting_loop: asyncio.AbstractEventLoop | None = None

    async def run_batch(self, items: list[tuple[str, object]]) -> list[Any]:
        """Run ``(queue, command)`` items in the shard; each result is a reply or a
        QueueError.

        Raises:
            Unavailable: the shard could not be reached, or the connection broke.
        """
        rid, batch, types = self._batch(items)
        return await self._call(rid, batch, types)

    def _batch(self, items: list[tuple[str, object]]) -> tuple[int, Batch, list[type]]:
        """A new request id, the ``Batch`` of ``items``, and each result's reply type."""
        rid = next(self._rids)
        # Commands are plain objects along the directory's API; the shard's decoder checks
        # them against cmd.Command, the type Batch declares for it.
        batch = Batch(rid, cast("list[tuple[str, cmd.Command]]", items))
        return rid, batch, [type(c) for _, c in items]

    def start_batch(self, items: list[tuple[str, object]], then: Callable[[Any], None]) -> bool:
        """:meth:`run_batch` without a task, when the connection is open: send now, and call
        ``then`` with the results as the reply arrives (in the connection's callback, no
        loop turn later), or with :class:`Unavailable` if the connection breaks first.
        False: nothing sent (not connected): use :meth:`run_batch`."""
        connection = self._open(asyncio.get_running_loop())
        if connection is None:
            return False
        rid, batch, types = self._batch(items)
        connection.pending[rid] = (_Then(connection, rid, then), types)
        connection.send(batch)
        return True

    async def execute_many(self, queue: str, commands: list[object]) -> list[Any]:
        """Run commands on a queue; each result is a reply or a QueueError.

        Raises:
            Unavailable: the shard could not be reached, or the connection broke.
        """
        return await self.run_batch([(queue, c) for c in commands])

    async def take(self, queue: str, take: cmd.Take, wait_s: float) -> Any:
        """A waiting take: deliveries or a QueueError. Cancelling it cancels it in the shard.

        Raises:
            Unavailable: the shard could not be reached, or the connection broke.
        """
        rid = next(self._rids)
        return await self._one(rid, TakeWait(rid, queue, take, wait_s), cmd.Take)

    async def watch_key(self, key: str, version: int) -> rp.KeyView:
        """The key's state once it is past ``version``. Cancelling it cancels it in the shard.

        Raises:
            QueueError: an invalid key; Unavailable as :meth:`take`.
        """
        rid = next(self._rids)
        return await self._one_or_raise(rid, WatchKey(rid, key, version))

    async def create(
        self, name: str, settings: QueueSettings, given: list[str]
    ) -> tuple[bool, QueueSettings]:
        """See QueueShard.create. Raises: QueueError."""
        rid = next(self._rids)
        created, actual = await self._one_or_raise(rid, CreateQueue(rid, name, settings, given))
        return created, actual

    async def delete(self, name: str) -> None:
        """See QueueShard.delete. Raises: QueueError."""
        rid = next(self._rids)
        await self._one_or_raise(rid, DeleteQueue(rid, name))

    async def names(self) -> list[str]:
        """The shard's queues. Raises: QueueError."""
        rid = next(self._rids)
        return await self._one_or_raise(rid, Names(rid))

    async def status(self, brief: bool = False) -> ShardStatus:
        """The shard's readiness (``brief``: without the queues' recovery reports).

        Raises: QueueError."""
        rid = next(self._rids)
        return await self._one_or_raise(rid, Status(rid, brief))

    async def metrics(self) -> list[QueueMetrics]:
        """Every queue's figures. Raises: QueueError."""
        rid = next(self._rids)
        return await self._one_or_raise(rid, Metrics(rid))

    async def history(self, name: str) -> list[Sample]:
        """Queue ``name``'s counts over the last hour. Raises: QueueError."""
        rid = next(self._rids)
        return await self._one_or_raise(rid, History(rid, name))

    async def _one_or_raise(self, rid: int, request: Any) -> Any:
        result = await self._one(rid, request, type(request))
        if isinstance(result, QueueError):
            raise result
        return result

    async def _one(self, rid: int, request: Any, reply_type: type) -> Any:
        """A call with one result; cancelling it cancels it in the shard."""
        try:
            [result] = await self._call(rid, request, [reply_type])
        except asyncio.CancelledError:
            connection = self._connection
            if connection is not None:
                connection.send(Cancel(rid))
            raise
        return result

    async def _call(self, rid: int, request: Any, types: list[type]) -> list[Any]:
        connection = await self._connect()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        connection.pending[rid] = (fut, types)
        try:
            connection.send(request)
            return await fut
        finally:
            connection.pending.pop(rid, None)

    def _open(self, loop: asyncio.AbstractEventLoop) -> _ClientConnection | None:
        """The connection, if it is open and of ``loop``."""
        connection = self._connection
        if connection is not None and connection.open and connection.loop is loop:
            return connection
        return None

    async def _connect(self) -> _ClientConnection:
        loop = asyncio.get_running_loop()
        connection = self._open(loop)
        if connection is not None:
            return connection
        if self._connecting is None or self._connecting_loop is not loop:
            # A client used from another event loop (a test's second asyncio.run) connects
            # again: the old connection's transport belongs to a loop that no longer runs.
            self._connecting, self._connecting_loop = asyncio.Lock(), loop
        async with self._connecting:
            connection = self._open(loop)
            if connection is not None:
                return connection
            try:
                host, port = await self._address()
                _, connection = await asyncio.get_running_loop().create_connection(
                    lambda: _ClientConnection(self._secret), host, port
                )
                # The shard's challenge, answered; requests may follow the answer at once
                # (the shard reads none before the proof), replies wait for its own proof.
                # A shard that says nothing (paused, cut off) is dropped as a silent one is.
                silence = PING_AFTER_S + SILENT_S
                await asyncio.wait_for(asyncio.shield(connection.challenged), silence)
            except (OSError, QueueError, TimeoutError, handshake.Refused) as exc:
                if connection_made := locals().get("connection"):
                    connection_made.abort()
                raise Unavailable(f"the queue's shard cannot be reached: {exc!r}") from None
            self._connection = connection
            return connection

    async def close(self) -> None:
        """Close the connection."""
        if self._connection is not None:
            self._connection.close()


class _Then:
    """A call's end that is a callback, not a future (:meth:`ChannelClient.start_batch`):
    it has what :class:`_ClientConnection` uses of a future, and leaves the connection's
    table of pending calls once answered."""

    __slots__ = ("connection", "fired", "rid", "then")

    def __init__(self, connection: _ClientConnection, rid: int, then: Callable[[Any], None]):
        self.connection = connection
        self.rid = rid
        self.then = then
        self.fired = False

    def done(self) -> bool:
        return self.fired

    def set_result(self, results: Any) -> None:
        self._fire(results)

    def set_exception(self, error: BaseException) -> None:
        self._fire(error)

    def _fire(self, outcome: Any) -> None:
        self.fired = True
        self.connection.pending.pop(self.rid, None)
        try:
            self.then(outcome)
        except Exception:  # the connection goes on with the other calls' replies
            log.exception("channel: a call's callback failed")


class _Ping:
    """The status request a silent connection sends (:meth:`_ClientConnection._watch`):
    its answer only proves the shard alive."""

    __slots__ = ("connection", "rid")

    def __init__(self, connection: _ClientConnection, rid: int) -> None:
        self.connection = connection
        self.rid = rid

    def done(self) -> bool:
        return False

    def set_result(self, results: Any) -> None:
        self.connection.pending.pop(self.rid, None)

    def set_exception(self, error: BaseException) -> None:
        self.connection.pending.pop(self.rid, None)


class _ClientConnection(asyncio.Protocol):
    """The gateway's end of a channel: requests out, replies matched to their calls."""

    def __init__(self, secret: str) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.frames = _Frames()
        self.handshake: handshake.Client | None = handshake.Client(secret)
        self.challenged: asyncio.Future[None] = self.loop.create_future()
        self.welcomed = False
        self.sealer: handshake.Sealed | None = None
        self.opener: handshake.Sealed | None = None
        self.pending: dict[int, tuple[asyncio.Future[Any] | _Then | _Ping, list[type]]] = {}
        self.open = False
        self.heard = self.loop.time()  # when the shard last sent anything
        self.asked: float | None = None  # when a status request went out, unanswered
        self._pings = itertools.count(-1, -1)  # request ids no caller uses
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # typeshed types it BaseTransport for every protocol; a stream's is a Transport
        self.transport = transport  # type: ignore[assignment]
        self.open = True
        self.heard = self.loop.time()
        self._timer = self.loop.call_later(WATCH_EVERY_S, self._watch)

    def _watch(self) -> None:
        """Calls wait and the shard said nothing for a while: ask it for its status; still
        nothing long after: drop the connection (its calls fail, ``Unavailable``)."""
        if not self.open or self.transport is None:
            return
        now = self.loop.time()
        if self.pending and now - self.heard > PING_AFTER_S:
            if self.asked is None:
                rid = next(self._pings)
                self.pending[rid] = (_Ping(self, rid), [Status])
                self.asked = now
                self.send(Status(rid, True))
            elif now - self.asked > SILENT_S:
                log.warning(
                    "channel: a shard answered nothing for %.0f s (paused, or cut off): "
                    "dropping the connection; its calls fail and are retried",
                    now - self.heard,
                )
                self.transport.abort()
                return
        self._timer = self.loop.call_later(WATCH_EVERY_S, self._watch)

    def send(self, request: Any) -> None:
        if self.transport is not None and self.open:
            body = _encoder.encode(request)
            if self.sealer is not None:
                body = self.sealer.seal(body)
            self.transport.write(_frame(body))

    def _shake(self, frame: bytes) -> None:
        """The shard's challenge (answered at once), then its proof (checked)."""
        shake = self.handshake
        assert shake is not None
        assert self.transport is not None
        if not self.challenged.done():
            challenge = _challenge_decoder.decode(frame)
            proof, sealer, self.opener = shake.answer(challenge.key, challenge.encrypt)
            self.transport.write(_frame(_encoder.encode(Hello(shake.public, proof))))
            self.sealer = sealer  # what is sent from now on is sealed
            self.challenged.set_result(None)
            return
        shake.confirm(_welcome_decoder.decode(frame).proof)
        self.handshake = None

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self.heard = self.loop.time()
        self.asked = None
        try:
            for frame in self.frames.feed(data):
                if self.handshake is not None:
                    self._shake(frame)
                    continue
                if self.opener is not None:
                    frame = self.opener.open(frame)
                reply = _reply_decoder.decode(frame)
                pending = self.pending.get(reply.rid)
                if pending is None:
                    continue  # a cancelled call's late answer
                fut, types = pending
                if not fut.done():
                    fut.set_result(
                        [_decode_result(i, t) for i, t in zip(reply.items, types, strict=True)]
                    )
        except handshake.Refused as exc:
            log.warning("channel: a shard did not prove this cluster's secret: %s", exc)
            if not self.challenged.done():
                self.challenged.set_exception(exc)
            self.abort()
        except (ConnectionError, msgspec.DecodeError, UnicodeDecodeError) as exc:
            log.warning("channel to a shard broke: %r", exc)
            if not self.challenged.done():
                self.challenged.set_exception(ConnectionError(f"bad handshake: {exc!r}"))
            self.abort()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            log.warning("channel to a shard broke: %r", exc)
        self.open = False
        self.transport = None
        if not self.challenged.done():
            self.challenged.set_exception(ConnectionError("closed during the handshake"))
        if self._timer is not None:
            self._timer.cancel()
        lost = Unavailable("the connection to the queue's shard broke; the call may have happened")
        for fut, _ in list(self.pending.values()):
            if not fut.done():
                fut.set_exception(lost)
