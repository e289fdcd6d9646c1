"""The server under test in the chaos campaign (``loadtest/chaos.py``) and how to reach it:
:class:`Deployment` (one ``evq serve``) and :class:`ClusterDeployment` (two Ray nodes, two
gateways), with what the faults need of them (their processes, the shards' channel ports,
SIGKILL and start again); :func:`readyz` and :func:`wait_answering`.

Imported as a sibling module (``python loadtest/chaos.py`` puts ``loadtest/`` first on
``sys.path``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos_env import S3_ENV, ObjectStore, answering
from served import RAY_ENV, ROOT, EvqServe, cmdline, free_port, kill_session, session_pids

if TYPE_CHECKING:
    from chaos_workload import Workload

__all__ = ["ClusterDeployment", "Deployment", "readyz", "wait_answering"]

CHANNEL_LINE = re.compile(rb"shard (\d+): data channel on [^:\s]+:(\d+)")


class Deployment:
    """One ``evq serve`` on a data directory, with what the faults need: its shard and
    gateway-worker processes, the shards' channel ports, SIGKILL and start again."""

    def __init__(
        self,
        root: Path,
        shards: int,
        workers: int,
        *,
        data: Path | None = None,
        store: ObjectStore | None = None,
    ) -> None:
        self.data = data or root / "data"
        self.log = root / "serve.log"
        self.port = free_port()
        self.shards = shards
        self.args = ["--shards", str(shards), "--workers", str(workers)]
        self.env: dict[str, str] = {}
        if store is not None:  # the log in the object store; --data holds nothing then
            self.args += store.server_args()
            self.env = dict(S3_ENV)
        self.server: EvqServe | None = None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.server = EvqServe(self.data, self.log, self.args, port=self.port, env=self.env)
        self.server.wait_ready(180)
        # the store keeps its count from now on (a resize fault may change it)
        at = self.args.index("--shards") if "--shards" in self.args else -1
        if at >= 0:
            del self.args[at : at + 2]

    def ready(self) -> bool:
        return answering(*readyz(self.url))

    def pids(self) -> list[int]:
        assert self.server is not None
        return session_pids(self.server.pid)

    def shard_pids(self) -> dict[int, int]:
        """Shard index → pid of the live shard processes that have opened their channel."""
        return {index: pid for index, (pid, _) in self._channels().items()}

    def channel_ports(self) -> dict[int, int]:
        return {index: port for index, (_, port) in self._channels().items()}

    def _channels(self) -> dict[int, tuple[int, int]]:
        found: dict[int, tuple[int, int]] = {}
        for pid in self.pids():
            if not cmdline(pid).startswith("ray::ShardActor"):
                continue
            with contextlib.suppress(OSError), open(os.readlink(f"/proc/{pid}/fd/2"), "rb") as f:
                for m in CHANNEL_LINE.finditer(f.read()):
                    found[int(m.group(1))] = (pid, int(m.group(2)))
        return found

    def worker_pids(self) -> list[int]:
        return [p for p in self.pids() if "gateway.workers" in cmdline(p)]

    def kill(self) -> None:
        assert self.server is not None
        kill_session(self.server.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.server.proc.wait(10)
        self.server._log.close()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(60)


class ClusterDeployment:
    """The two-node set-up: a Ray head (127.0.0.2) and a second node (127.0.0.3), both
    offering ``evq_shard``, with Ray's health checks tightened (a node is dead after 3
    failed checks 0.5 s apart), and two gateways (``evq serve --ray-address``) that spread
    the shards over both nodes. The store is one local directory both nodes see."""

    HEAD_IP, SECOND_IP = "127.0.0.2", "127.0.0.3"
    ENV = {
        "EVQ_CLUSTER_SECRET": "chaos-campaign-cluster-secret",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
        "RAY_health_check_initial_delay_ms": "0",
        "RAY_health_check_period_ms": "500",
        "RAY_health_check_timeout_ms": "500",
        "RAY_health_check_failure_threshold": "3",
    }

    def __init__(self, root: Path, shards: int, workers: int) -> None:
        self.root = root
        self.data = root / "data"
        self.log = root / "serve.log"
        self.shards = shards
        self.gcs = free_port()
        self.address = f"{self.HEAD_IP}:{self.gcs}"
        self.ray = str(Path(sys.executable).with_name("ray"))
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.ports = [free_port(), free_port()]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.url = ",".join(self.urls)
        self.gateways: list[EvqServe | None] = [None, None]
        self.args = ["--ray-address", self.address, "--shards", str(shards)]
        self.args += ["--shard-spread", "--shard-resource", "evq_shard"]
        self.args += ["--workers", str(workers)]

    def _node(self, name: str) -> None:
        slots = json.dumps({"evq_shard": 2 * self.shards})
        if name == "head":
            args = ["--head", "--port", str(self.gcs), "--node-ip-address", self.HEAD_IP]
            args += ["--include-dashboard", "false", "--temp-dir", str(self.root / "ray")]
        else:
            args = ["--address", self.address, "--node-ip-address", self.SECOND_IP]
        ports: list[str] = []
        for flag in ("--node-manager-port", "--object-manager-port",
                     "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                     "--runtime-env-agent-port", "--metrics-export-port"):  # fmt: skip
            ports += [flag, str(free_port())]
        cmd = [self.ray, "start", "--block", "--disable-usage-stats", *args, *ports]
        cmd += ["--num-cpus", "1", "--resources", slots, "--min-worker-port", "0"]
        cmd += ["--max-worker-port", "0"]
        with open(self.root / f"{name}.log", "ab") as log:
            self.nodes[name] = subprocess.Popen(
                cmd, env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def _env(self) -> dict[str, str]:
        return {**os.environ, **RAY_ENV, **self.ENV, "PYTHONUNBUFFERED": "1"}

    def start(self) -> None:
        self._node("head")
        time.sleep(3)
        self._node("second")
        time.sleep(3)
        for i in range(2):
            self.start_gateway(i)

    def start_gateway(self, i: int) -> None:
        gw = EvqServe(self.data, self.root / f"gateway{i}.log", self.args, self.ports[i],
                      self.ENV)  # fmt: skip
        self.gateways[i] = gw
        gw.wait_ready(180)

    def ready(self) -> bool:
        return all(answering(*readyz(u)) for u in self.urls)

    def pids(self) -> list[int]:
        pids = []
        for proc in self.nodes.values():
            pids += session_pids(proc.pid)
        for gw in self.gateways:
            if gw is not None:
                pids += session_pids(gw.pid)
        return pids

    shard_pids = Deployment.shard_pids
    channel_ports = Deployment.channel_ports
    _channels = Deployment._channels

    worker_pids = Deployment.worker_pids

    def kill_gateway(self, i: int) -> None:
        gw = self.gateways[i]
        assert gw is not None
        kill_session(gw.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            gw.proc.wait(10)
        gw._log.close()

    def kill_node(self, name: str) -> None:
        proc = self.nodes.pop(name)
        kill_session(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)

    def stop(self) -> None:
        for gw in self.gateways:
            if gw is not None and gw.proc.poll() is None:
                gw.stop(60)
        subprocess.run(
            [sys.executable, "-m", "evq", "shards", "stop", "--ray-address", self.address],
            cwd=ROOT, env=self._env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            check=False, timeout=120,
        )  # fmt: skip
        for name in list(self.nodes):
            self.kill_node(name)


def readyz(url: str) -> tuple[int | None, Any]:
    """``/readyz``'s status and document (None, None: no answer)."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        with contextlib.suppress(ValueError, OSError):
            return exc.code, json.loads(exc.read() or b"null")
        return exc.code, None
    except (OSError, ValueError):
        return None, None


def wait_answering(
    dep: Deployment | ClusterDeployment,
    timeout: float = 120.0,
    work: Workload | None = None,
    since_ms: int = 0,
) -> float:
    """Seconds until ``/readyz`` answers 200 with no shard degraded (a full disk: 200, but
    puts refused; a failed log: 503 until the shard's new process recovered), every shard
    has a channel again, and (given ``work``) every shard's probe sent after ``since_ms``
    went through: /readyz stays 200 while a restarted shard recovers (on S3, seconds)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        probed = work is None or all(
            work.probed_ok.get(i, 0) >= since_ms for i in range(dep.shards)
        )
        if probed and dep.ready() and len(dep.shard_pids()) >= dep.shards:
            return time.monotonic() - started
        time.sleep(0.1)
    raise RuntimeError(f"the server did not answer again within {timeout} s")
