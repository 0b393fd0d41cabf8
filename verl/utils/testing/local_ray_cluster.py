"""A real multi-node Ray cluster on this machine, for tests: every node is its own ``ray start`` on 127.0.0.1.

Each node has its own raylet (and agents, and the worker processes it forks), its own resource counts
(``--num-cpus``, ``--resources='{"NPU": n}'``, as a real Ascend node advertises) and its own node id, so placement
groups, node affinity, per-node device visibility and node failure behave as on a cluster of machines. The head
adds the GCS. Addresses stay on the loopback (:mod:`verl.utils.testing.ray_loopback`).

Processes are tracked by id, never by name: every ``ray start`` runs in a new session, and Ray's daemons keep that
session, so a node's processes are exactly the processes of its session plus their descendants (the raylet forks
the workers). :meth:`LocalRayCluster.kill_node` SIGKILLs one node's processes (node loss); :meth:`shutdown`
SIGKILLs all of them and :meth:`surviving_pids` checks that none is left. Nothing here runs ``ray stop``, which
would stop every Ray instance on the machine, other people's included.

Every node takes ~0.3 GB (raylet, dashboard and runtime-env agents) before any worker starts; the head ~0.6 GB.

Test fixture: never imported by verl at run time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "LocalRayCluster",
    "LocalRayNode",
    "free_port",
    "local_ray_cluster",
    "loopback_command",
    "process_table",
]

LOOPBACK = "127.0.0.1"
# Ray's per-node object store default is 30% of RAM; a test moves small batches, and /dev/shm is shared.
OBJECT_STORE_BYTES = 256 * 1024**2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def loopback_command(program: str, *args: str) -> list[str]:
    """``python -m verl.utils.testing.ray_loopback PROGRAM ARGS``: ``ray`` (its CLI) or a module to run."""
    return [sys.executable, "-m", "verl.utils.testing.ray_loopback", program, *args]


class Proc(NamedTuple):
    """A live process: parent, session, start time (clock ticks since boot: with the pid, its identity) and
    command line."""

    ppid: int
    session_id: int
    start: int
    cmdline: str


def process_table() -> dict[int, Proc]:
    """``{pid: Proc}`` of every live (not zombie) process this user can see (Linux ``/proc``)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited while we looked
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session ...
        if fields[0] == "Z":  # a zombie holds no resources; its parent reaps it
            continue
        table[int(entry)] = Proc(int(fields[1]), int(fields[3]), int(fields[19]), cmdline.strip())
    return table


def process_table_entry(pid: int) -> Proc | None:
    """The live process ``pid`` (None if gone or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else Proc(int(fields[1]), int(fields[3]), int(fields[19]), "")


def _tree(roots: set[int], table: dict[int, Proc]) -> set[int]:
    """``roots`` and all their live descendants."""
    found = {pid for pid in roots if pid in table}
    grew = True
    while grew:
        children = {pid for pid, proc in table.items() if proc.ppid in found and pid not in found}
        found |= children
        grew = bool(children)
    return found


@dataclass
class LocalRayNode:
    """One ``ray start`` of the cluster: its session (the id of the ``ray start`` process) and its Ray node id."""

    name: str
    session_id: int
    node_id: str
    head: bool
    start_output: str = field(repr=False, default="")

    def pids(self, table: dict[int, Proc] | None = None) -> set[int]:
        """Live processes of this node: its session (GCS, raylet, agents, ...) and their descendants (workers)."""
        table = process_table() if table is None else table
        roots = {pid for pid, proc in table.items() if proc.session_id == self.session_id}
        return _tree(roots, table)

    def raylet_pid(self, table: dict[int, Proc] | None = None) -> int:
        table = process_table() if table is None else table
        raylets = [pid for pid in self.pids(table) if "/raylet/raylet " in table[pid].cmdline + " "]
        if len(raylets) != 1:
            raise RuntimeError(f"node {self.name}: expected one raylet process, found {raylets}")
        return raylets[0]

    def raylet_node_id(self) -> str:
        """The Ray node id, from the raylet's command line (``--node_id=<hex>``)."""
        table = process_table()
        for arg in table[self.raylet_pid(table)].cmdline.split():
            if arg.startswith("--node_id="):
                return arg.split("=", 1)[1]
        raise RuntimeError(f"node {self.name}: the raylet's command line has no --node_id")


class LocalRayCluster:
    """Start with :meth:`start_head`, add nodes with :meth:`add_node`, connect drivers to :attr:`address`.

    ``env`` is the environment of every ``ray start`` (Ray workers inherit it from their raylet, not from the
    driver): pass what the test's workers need (``PYTHONPATH``, ``OMP_NUM_THREADS``, ...).
    """

    def __init__(self, env: dict[str, str] | None = None) -> None:
        # Ray's sockets live under the temp dir and a Unix socket path has at most 107 bytes: a short private dir
        # (removed by shutdown) instead of pytest's deep tmp_path.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="verl-ray-"))
        self.env = dict(os.environ if env is None else env)
        self.nodes: list[LocalRayNode] = []
        self.port: int | None = None
        self._seen: set[tuple[int, int]] = set()  # (pid, start) of every process ever found for a node

    @property
    def address(self) -> str:
        if self.port is None:
            raise RuntimeError("the cluster has no head yet: call start_head() first")
        return f"{LOOPBACK}:{self.port}"

    def start_head(self, num_cpus: int, resources: dict[str, float] | None = None, name: str = "head") -> LocalRayNode:
        self.port = free_port()
        args = ["--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}", *self.head_port_args()]
        return self._start(name, True, [*args, *self.node_args(num_cpus, resources, name)])

    def add_node(self, num_cpus: int, resources: dict[str, float] | None = None, name: str | None = None):
        name = name or f"node{len(self.nodes)}"
        args = [f"--address={self.address}", *self.node_args(num_cpus, resources, name), *self.worker_node_args()]
        return self._start(name, False, args)

    @staticmethod
    def worker_node_args() -> list[str]:
        """Flags of a non-head node sharing the machine with the head: no second log monitor (both would stream
        the one session log directory to the driver, printing every worker line twice)."""
        return ["--include-log-monitor=false"]

    @staticmethod
    def head_port_args() -> list[str]:
        """Ports the head would otherwise take at fixed defaults (and clash with other Ray instances here)."""
        return [f"--ray-client-server-port={free_port()}", f"--dashboard-port={free_port()}"]

    @staticmethod
    def node_args(num_cpus: int | None, resources: dict[str, float] | None, name: str | None) -> list[str]:
        """Flags every node of a test needs besides the user's: loopback address, free ports, small object store."""
        args = [
            f"--node-ip-address={LOOPBACK}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
        ]
        if num_cpus is not None:
            args.append(f"--num-cpus={num_cpus}")
        if resources:
            args.append(f"--resources={json.dumps(resources)}")
        if name is not None:
            args.append(f"--node-name={name}")
        return args

    def run_ray_start(self, name: str, head: bool, args: list[str]) -> LocalRayNode:
        """Run ``ray start ARGS`` (already complete: the caller's own command line) as node ``name``."""
        return self._start(name, head, args)

    def _start(self, name: str, head: bool, args: list[str]) -> LocalRayNode:
        process = subprocess.Popen(
            loopback_command("ray", "start", *args),
            env=self.env,
            start_new_session=True,  # the daemons keep this session: that is how the node's pids are found
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        output, _ = process.communicate(timeout=180)
        node = LocalRayNode(name=name, session_id=process.pid, node_id="", head=head, start_output=output)
        self.nodes.append(node)
        self._remember(node.pids())
        if process.returncode != 0:
            raise RuntimeError(f"ray start {' '.join(args)} failed ({process.returncode}):\n{output[-3000:]}")
        if head and self.port is None:
            self.port = _port_of(args)
        node.node_id = node.raylet_node_id()
        return node

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Block until the GCS lists every started node alive (``python -m verl.utils.ray_cluster wait``)."""
        command = loopback_command(
            "verl.utils.ray_cluster", "wait", f"--address={self.address}", f"--nodes={len(self.nodes)}"
        )
        out = subprocess.run([*command, f"--timeout={timeout_s:g}"], env=self.env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"the test cluster did not come up:\n{out.stdout[-2000:]}{out.stderr[-3000:]}")

    def node_table(self) -> list[dict]:
        """``[{"node_id", "address", "name", "is_head", "alive", "resources"}]`` as the GCS sees it, from
        ``python -m verl.utils.ray_cluster nodes --json`` in a subprocess (the test process never joins the cluster)."""
        command = loopback_command("verl.utils.ray_cluster", "nodes", f"--address={self.address}", "--json")
        out = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"listing the nodes of {self.address} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def node(self, name: str) -> LocalRayNode:
        return next(n for n in self.nodes if n.name == name)

    def kill_node(self, name: str) -> list[int]:
        """SIGKILL node ``name``'s raylet, agents and workers (a machine losing power); returns the pids killed."""
        table = process_table()
        pids = self.node(name).pids(table)
        self._remember(pids, table)
        _kill(sorted(pids), table)
        return sorted(pids)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """SIGKILL every process of every node, repeatedly until none is left (or ``timeout_s`` passes), then remove
        the temp dir (sessions, logs, sockets)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            table = process_table()
            pids = self._live(table)
            if not pids:
                break
            self._remember(pids, table)
            _kill(sorted(pids), table)
            time.sleep(0.2)
        if not self._live(process_table()):
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def surviving_pids(self) -> list[int]:
        """Processes of this cluster still running (empty after :meth:`shutdown`)."""
        return sorted(self._live(process_table()))

    def _live(self, table: dict[int, Proc]) -> set[int]:
        """Live processes of every node, and those seen before that still run (same pid AND start time: a reused
        pid is someone else's process)."""
        pids = set().union(*(node.pids(table) for node in self.nodes)) if self.nodes else set()
        return pids | {pid for pid, start in self._seen if pid in table and table[pid].start == start}

    def _remember(self, pids: set[int], table: dict[int, Proc] | None = None) -> None:
        table = process_table() if table is None else table
        self._seen |= {(pid, table[pid].start) for pid in pids if pid in table}


def _port_of(args: list[str]) -> int:
    for arg in args:
        if arg.startswith("--port="):
            return int(arg.split("=", 1)[1])
    return 6379  # ray start's default


def _kill(pids: list[int], table: dict[int, Proc]) -> None:
    """SIGKILL each pid of ``table`` that is still the process ``table`` describes."""
    for pid in pids:
        now = process_table_entry(pid)
        if now is None or now.start != table[pid].start:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def local_ray_cluster(
    nodes: list[tuple[int, dict[str, float] | None]], env: dict[str, str] | None = None
) -> Iterator[LocalRayCluster]:
    """A started cluster of ``nodes`` (``(cpu slots, other resources)`` each; the first is the head, named
    ``node0``, the others ``node1``, ...), shut down by pid on exit; raises if any of its processes survives."""
    cluster = LocalRayCluster(env=env)
    try:
        (head_cpus, head_resources), *others = nodes
        cluster.start_head(head_cpus, head_resources, name="node0")
        for index, (cpus, resources) in enumerate(others, start=1):
            cluster.add_node(cpus, resources, name=f"node{index}")
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.shutdown()
    left = cluster.surviving_pids()
    if left:
        raise RuntimeError(f"processes of the test Ray cluster survived its shutdown: {left}")
