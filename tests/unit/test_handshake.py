"""The cluster handshake (actors/handshake.py), pure: two ends that share the secret agree and
their sealed frames round-trip in order; any other secret, a replayed or reflected proof, a
changed, replayed, dropped or reordered frame is refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.handshake import Client, Refused, Sealed, Server

secrets = st.binary(min_size=16, max_size=64)
bodies = st.lists(st.binary(max_size=300), min_size=1, max_size=20)


def _shake(
    server_secret: bytes, client_secret: bytes, encrypt: bool
) -> tuple[
    Server, Client, tuple[Sealed | None, Sealed | None], tuple[Sealed | None, Sealed | None]
]:
    server, client = Server(server_secret, encrypt), Client(client_secret)
    proof, c_seal, c_open = client.answer(server.public, encrypt)
    s_proof, s_seal, s_open = server.accept(client.public, proof)
    client.confirm(s_proof)
    return server, client, (c_seal, c_open), (s_seal, s_open)


@settings(max_examples=50, deadline=None)
@given(secret=secrets, encrypt=st.booleans(), up=bodies, down=bodies)
def test_ends_with_the_secret_agree_and_frames_round_trip(
    secret: bytes, encrypt: bool, up: list[bytes], down: list[bytes]
) -> None:
    _, _, (c_seal, c_open), (s_seal, s_open) = _shake(secret, secret, encrypt)
    if not encrypt:
        assert (c_seal, c_open, s_seal, s_open) == (None, None, None, None)
        return
    assert c_seal
    assert c_open
    assert s_seal
    assert s_open
    for body in up:
        sealed = c_seal.seal(body)
        assert len(body) < 8 or body not in sealed  # short ones may appear by chance
        assert s_open.open(sealed) == body
    for body in down:
        assert c_open.open(s_seal.seal(body)) == body


@settings(max_examples=50, deadline=None)
@given(a=secrets, b=secrets, encrypt=st.booleans())
def test_another_secret_is_refused_by_the_server(a: bytes, b: bytes, encrypt: bool) -> None:
    if a == b:
        return
    server, client = Server(a, encrypt), Client(b)
    proof, _, _ = client.answer(server.public, encrypt)
    with pytest.raises(Refused):
        server.accept(client.public, proof)


@settings(max_examples=30, deadline=None)
@given(a=secrets, b=secrets)
def test_a_server_without_the_secret_is_refused_by_the_client(a: bytes, b: bytes) -> None:
    if a == b:
        return
    server, client = Server(a, True), Client(b)
    proof, _, _ = client.answer(server.public, True)
    forged = Server(b, True)  # answers with its own proof for another challenge
    other_client = Client(b)
    other_proof, _, _ = other_client.answer(forged.public, True)
    s_proof, _, _ = forged.accept(other_client.public, other_proof)
    with pytest.raises(Refused):
        client.confirm(s_proof)
    with pytest.raises(Refused):
        server.accept(client.public, proof[:-1] + bytes([proof[-1] ^ 1]))


def test_a_recorded_answer_does_not_open_another_connection() -> None:
    secret = b"a cluster secret of enough length"
    first, client = Server(secret, True), Client(secret)
    proof, _, _ = client.answer(first.public, True)
    first.accept(client.public, proof)
    second = Server(secret, True)  # the next connection: a fresh key
    with pytest.raises(Refused):
        second.accept(client.public, proof)  # replayed


def test_the_encryption_flag_is_bound_to_the_proof() -> None:
    secret = b"a cluster secret of enough length"
    server, client = Server(secret, True), Client(secret)
    proof, _, _ = client.answer(server.public, False)  # told "plain" by someone on the way
    with pytest.raises(Refused):
        server.accept(client.public, proof)


def test_a_client_proof_cannot_be_reflected_as_the_servers() -> None:
    secret = b"a cluster secret of enough length"
    server, client = Server(secret, True), Client(secret)
    proof, _, _ = client.answer(server.public, True)
    with pytest.raises(Refused):
        client.confirm(proof)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_changed_replayed_dropped_or_reordered_frames_do_not_open(data: st.DataObject) -> None:
    secret = b"a cluster secret of enough length"
    _, _, (c_seal, _), (_, s_open) = _shake(secret, secret, True)
    assert c_seal
    assert s_open
    frames = [c_seal.seal(b"frame %d" % i) for i in range(3)]
    attack = data.draw(st.sampled_from(["flip", "replay", "drop", "swap"]))
    if attack == "flip":
        i = data.draw(st.integers(0, len(frames[0]) - 1))
        bad = bytearray(frames[0])
        bad[i] ^= 1 << data.draw(st.integers(0, 7))
        stream = [bytes(bad)]
    elif attack == "replay":
        assert s_open.open(frames[0]) == b"frame 0"
        stream = [frames[0]]
    elif attack == "drop":
        stream = [frames[1]]
    else:
        stream = [frames[1]]  # swapped: the second frame first
    for frame in stream[:-1]:
        s_open.open(frame)  # a frame that came in order opens
    with pytest.raises(Refused):
        s_open.open(stream[-1])


def test_a_malformed_key_is_refused() -> None:
    secret = b"a cluster secret of enough length"
    server, client = Server(secret, True), Client(secret)
    with pytest.raises(Refused):
        client.answer(b"\x00" * 32, True)  # a low-order point: no shared secret
    proof, _, _ = client.answer(server.public, True)
    with pytest.raises(Refused):
        server.accept(b"short", proof)
