"""loadtest/overload.py's arithmetic, without a server: the latency histogram's quantiles,
the RSS slope, when a recovery counts, what "10x" is, the lean client's reply parsing, and
the sampler's reading of a session (two idle processes, through loadtest/procstat.py).
The tool against a real server: tests/integration/test_overload.py."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

import overload
import overload_judge
from overload_load import Pool, bucket, quantile
from overload_sample import MIB, Sampler, role
from overload_soak import slope_mib_per_hour


def test_quantiles_of_the_histogram_are_within_five_percent() -> None:
    hist: Counter[int] = Counter()
    for ms in range(1, 1001):  # 1..1000 ms, one each
        hist[bucket(float(ms))] += 1
    assert quantile(hist, 0.5) == pytest.approx(500, rel=0.05)
    assert quantile(hist, 0.99) == pytest.approx(990, rel=0.05)
    assert quantile(Counter(), 0.5) is None


def test_the_rss_slope_is_least_squares_in_mib_per_hour() -> None:
    points = [(float(t), 100.0 + t / 60) for t in range(0, 600, 5)]  # 1 MiB a minute
    assert slope_mib_per_hour(points) == pytest.approx(60.0)
    noisy = [(float(t), 100.0 + (3 if t % 10 else -3)) for t in range(0, 600, 5)]
    assert abs(slope_mib_per_hour(noisy) or 0) < 5  # flat, however noisy
    assert slope_mib_per_hour([(0.0, 1.0), (1.0, 2.0)]) is None


def test_recovery_counts_from_the_first_of_three_good_seconds_in_a_row() -> None:
    rate = 100.0

    def second(ok: int, refused: int = 0) -> Counter[str]:
        return Counter({"ok": ok, "r429": refused})

    seconds = {0: second(0, 100), 1: second(90, 10), 2: second(100), 3: second(99, 1)}
    seconds |= {4: second(100), 5: second(100), 6: second(100), 7: second(10)}
    # 0 and 1 refused too much; 2, 3 (99 % ok) and 4 are good; the last second is never
    # complete (a later report may still add to it)
    assert overload._recovered(seconds, rate, 3) == 2.0
    seconds[3] = second(98, 2)
    assert overload._recovered(seconds, rate, 3) == 4.0
    seconds[5] = second(40)  # answered, but less than half the rate
    assert overload._recovered(seconds, rate, 3) is None


def test_ten_times_is_said_in_messages_bytes_and_requests() -> None:
    args = overload.parse(["overload", "--batch", "10", "--size", "1000"])
    offered = overload.offer(args, {"messages_per_s": 20_000.0, "requests_per_s": 2_000.0})
    assert offered["messages_per_s"] == 200_000
    assert offered["bytes_per_s"] == 200_000_000
    assert offered["messages_per_request"] == 50
    assert offered["requests_per_s"] == 4_000
    assert "2.00x its request rate" in offered["means"]


def test_the_shard_allowance_is_the_requests_in_flight_plus_slack() -> None:
    args = overload.parse(["overload", "--max-requests", "100", "--workers", "2"])
    allowances = overload_judge.allowances_mib(args)
    request = allowances["request_bytes"]
    assert request > 50 * 1000  # 50 bodies of 1000 bytes, as JSON
    assert allowances["shard_mib"] == round(16 + 200 * request / MIB, 1)


async def test_the_client_reads_status_retry_after_and_body_across_chunks() -> None:
    replies = [
        b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\nRetry-After: 1\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
    ]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for reply in replies:
            await reader.readuntil(b"\r\n\r\n")
            for i in range(0, len(reply), 7):  # in small pieces
                writer.write(reply[i : i + 7])
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Pool(port, cap=1)
    conn = await pool.get()
    assert conn is not None
    raw = b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    assert await conn.request(raw) == (429, True, b"{}")
    assert await conn.request(raw) == (200, False, b"hello")
    assert conn.closed  # Connection: close
    pool.put_back(conn, True)
    assert pool.open == 0
    server.close()
    await server.wait_closed()


@pytest.mark.integration  # a subprocess
def test_the_sampler_reads_each_process_of_the_session_in_mib_with_its_role(
    session: tuple[int, int],
) -> None:
    leader, child = session
    sampler = Sampler(leader, fds=True)
    now = sampler.sample(1.0)
    assert sorted(now) == sorted([leader, child])
    assert sampler.roles == {leader: "gateway", child: "ray"}  # the server, then by cmdline
    for pid, mib in now.items():
        process = psutil.Process(pid)
        assert mib == pytest.approx(process.memory_info().rss / MIB, rel=0.05)
        assert sampler.rss[pid] == [(1.0, mib)]
        assert sampler.fd[pid] == [process.num_fds()]
    assert sampler.judged() == [leader]  # Ray's own (here: anything else) only reported
    assert role(2**22 + 1, leader) == "gone"  # above Linux's pid_max: never a process
