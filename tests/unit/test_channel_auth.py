"""Who may speak on the data channel, over real TCP on 127.0.0.1: a replayed, a forged and a
missing credential are refused and logged; a shard without the secret is not believed; and
the bytes on the wire, as a proxy in the middle records them, never hold the secret (nor,
sealed, a message's body)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from actors import channel, handshake
from actors.channel import Challenge, ChannelClient, ChannelServer, Hello, Status
from actors.core import commands as cmd
from actors.errors import Unavailable
from actors.log.store import LocalDirStore
from actors.settings import QueueSettings
from actors.shard import QueueShard
from tests.tap import Tap

SECRET = "the-cluster-secret-0123456789"
_LEN = struct.Struct("<I")
_encoder = msgspec.msgpack.Encoder()


class Shard:
    def __init__(self, server: ChannelServer, address: tuple[str, int], shard: QueueShard):
        self.server, self.address, self.shard = server, address, shard


@pytest.fixture(params=[None, True], ids=["plain", "sealed"])
async def shard(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Shard]:
    store = LocalDirStore(tmp_path)
    queue_shard = QueueShard(0, 1, store)
    await queue_shard.start()
    await queue_shard.create("q", QueueSettings(), [])
    server = ChannelServer(queue_shard, SECRET, encrypt=request.param)
    address = await server.start("127.0.0.1")
    yield Shard(server, address, queue_shard)
    await server.close()
    await queue_shard.close()
    await store.close()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _LEN.unpack(await reader.readexactly(4))
    return await reader.readexactly(size)


def _frame(obj: object) -> bytes:
    body = _encoder.encode(obj)
    return _LEN.pack(len(body)) + body


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the other end closed the connection (within 5 s)."""
    try:
        rest = await asyncio.wait_for(reader.read(), 5)
    except ConnectionResetError:
        return True
    return rest == b""


async def test_a_replayed_hello_is_refused_and_logged(
    shard: Shard, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await asyncio.open_connection(*shard.address)
    challenge = msgspec.msgpack.decode(await _read_frame(reader), type=Challenge)
    me = handshake.Client(SECRET)
    proof, _, _ = me.answer(challenge.key, challenge.encrypt)
    recorded = _frame(Hello(me.public, proof))
    writer.write(recorded)
    welcome = msgspec.msgpack.decode(await _read_frame(reader), type=channel.Welcome)
    me.confirm(welcome.proof)  # the first connection is good
    writer.close()
    # Someone who recorded it sends the same Hello on a new connection.
    reader, writer = await asyncio.open_connection(*shard.address)
    await _read_frame(reader)  # another challenge
    writer.write(recorded)
    assert await _closed(reader)
    writer.close()
    assert shard.server.refused == 1
    assert any("refused a connection" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("first", ["status", "garbage", "wrong secret"])
async def test_a_connection_that_does_not_begin_with_the_proof_is_refused(
    shard: Shard, first: str, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await asyncio.open_connection(*shard.address)
    challenge = msgspec.msgpack.decode(await _read_frame(reader), type=Challenge)
    if first == "status":
        writer.write(_frame(Status(1, True)))
    elif first == "garbage":
        writer.write(_LEN.pack(5) + b"\xc1\xc1\xc1\xc1\xc1")
    else:
        forger = handshake.Client("not-the-cluster-secret-000")
        proof, _, _ = forger.answer(challenge.key, challenge.encrypt)
        writer.write(_frame(Hello(forger.public, proof)))
    writer.write(_frame(Status(2, True)))
    assert await _closed(reader)  # and no status came back
    writer.close()
    assert shard.server.refused == 1
    [record] = [r for r in caplog.records if "refused a connection" in r.getMessage()]
    assert "127.0.0.1" in record.getMessage()
    assert SECRET not in caplog.text


async def test_a_connection_that_says_nothing_is_refused_in_time(
    shard: Shard, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel, "HANDSHAKE_S", 0.3)
    reader, writer = await asyncio.open_connection(*shard.address)
    await _read_frame(reader)
    assert await _closed(reader)
    writer.close()
    assert shard.server.refused == 1


async def test_a_shard_without_the_secret_is_not_believed(
    shard: Shard, caplog: pytest.LogCaptureFixture
) -> None:
    impostor = ChannelServer(shard.shard, "another-secret-0123456789", encrypt=True)
    address = await impostor.start("127.0.0.1")

    async def where() -> tuple[str, int]:
        return address

    client = ChannelClient(where, SECRET)
    try:
        with pytest.raises(Unavailable):
            await asyncio.wait_for(client.execute_many("q", [cmd.Stats()]), 10)
    finally:
        await client.close()
        await impostor.close()
    assert impostor.refused == 1  # it did not believe the gateway either


async def test_a_forged_welcome_is_not_believed(caplog: pytest.LogCaptureFixture) -> None:
    """A listener that answers the handshake without the secret (it cannot make the proof):
    the gateway drops it before believing any reply."""
    heard: list[bytes] = []

    async def forger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        fake = handshake.Server("not-the-secret-0123456789", False)
        writer.write(_frame(Challenge(fake.public, False)))
        heard.append(await _read_frame(reader))
        writer.write(_frame(channel.Welcome(b"\x00" * 32)))
        writer.write(_frame(channel._Results(1, [])))
        await reader.read()
        writer.close()

    server = await asyncio.start_server(forger, "127.0.0.1", 0)
    address = server.sockets[0].getsockname()[:2]

    async def where() -> tuple[str, int]:
        return address

    client = ChannelClient(where, SECRET)
    try:
        with pytest.raises(Unavailable):
            await asyncio.wait_for(client.execute_many("q", [cmd.Stats()]), 10)
    finally:
        await client.close()
        server.close()
    assert heard  # it answered the challenge: a proof, not the secret
    assert SECRET.encode() not in heard[0]
    assert any("did not prove" in r.getMessage() for r in caplog.records)


async def test_the_bytes_on_the_wire_never_hold_the_secret(shard: Shard) -> None:
    tap = Tap(shard.address)
    address = await tap.start()

    async def where() -> tuple[str, int]:
        return address

    client = ChannelClient(where, SECRET)
    body = b"a-private-message-body-42"
    try:
        await client.execute_many("q", [cmd.Put([cmd.NewMessage(body=body)])])
        [took] = await client.execute_many("q", [cmd.Take(max=1)])
        assert took[0].body == body
    finally:
        await client.close()
        await asyncio.wait_for(tap.done.wait(), 10)
        assert tap.server is not None
        tap.server.close()
    seen = bytes(tap.seen)
    assert len(seen) > 200
    assert SECRET.encode() not in seen
    sealed = shard.server._encrypt is True
    assert (body in seen) is not sealed  # plain: the tap sees bodies; sealed: it does not
