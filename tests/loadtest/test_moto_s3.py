"""loadtest/moto_s3.py: moto's S3 writes keys one request at a time, so a conditional put's
check and write are one step, as S3's are (the session's moto server has it applied)."""

from __future__ import annotations

import threading
from typing import Any

from botocore.exceptions import ClientError

from loadtest import moto_s3
from tests.conftest import S3Server


def test_a_write_waits_for_the_one_in_progress_and_only_the_first_conditional_put_wins(
    s3_server: S3Server,
) -> None:
    client = s3_server.boto3_client()
    key = f"{s3_server.fresh_prefix()}/k"
    done: list[Any] = []

    def put(body: bytes) -> None:
        try:
            client.put_object(Bucket=s3_server.bucket, Key=key, Body=body, IfNoneMatch="*")
            done.append("won")
        except ClientError as exc:
            done.append(exc.response["Error"]["Code"])

    try:
        with moto_s3._LOCK:  # as if another write were in progress in the server
            first = threading.Thread(target=put, args=(b"first",))
            first.start()
            first.join(0.5)
            assert first.is_alive(), "the write did not wait for the one in progress"
            assert done == []
        first.join(10)
        assert done == ["won"]
        put(b"second")
        assert done == ["won", "PreconditionFailed"]
        assert client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read() == b"first"
    finally:
        client.close()


def test_the_server_command_is_moto_s_with_the_writes_serialized() -> None:
    from moto.s3.responses import S3Response

    moto_s3.atomic_conditional_writes()
    moto_s3.atomic_conditional_writes()  # twice: wrapped once
    for name in ("_key_response_put", "_key_response_post"):
        method = getattr(S3Response, name)
        assert getattr(method, moto_s3._PATCHED)
        assert not getattr(method.__wrapped__, moto_s3._PATCHED, False)
