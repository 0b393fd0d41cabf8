"""``main_ppo`` on a real two-node Ray cluster on this machine, launched by the command lines of docs/ascend.md.

The cluster: two ``ray start`` nodes on 127.0.0.1 (:class:`~verl.utils.testing.local_ray_cluster.LocalRayCluster`),
each its own raylet with its own resources: the head declares 2 CPU slots (one for the TaskRunner, one for a
worker), the second node 1, so ``trainer.nnodes=2 trainer.n_gpus_per_node=1`` can only run one worker per node.

Invariants:
* The multi-node launch of docs/ascend.md, executed from the doc's own text (``ray start`` head and node, the
  readiness wait, ``RAY_ADDRESS=... python -m verl.trainer.main_ppo trainer.nnodes=2 ...``), trains GRPO with one
  FSDP2 rank per node (gloo across the nodes), rank 0 on the head, and equals the one-node run of the same world
  size: every per-step metric and every tensor of the final checkpoint (model, optimizer) bitwise.
* The readiness wait names what is missing (a node that has not joined, a resource a node lacks).
* A cluster too small for ``nnodes x n_gpus_per_node`` is refused before any worker starts, naming the node and
  the resource it lacks.
* Workers on the second node see the driver's ``HCCL_*`` / ``ASCEND_*`` variables (which that node's ``ray start``
  never had) and their own device visibility (the NPU Ray gave them, never the driver's list); tearing the cluster
  down leaves no Ray process behind.
* slow: the same two-node run on the engine worker path and on the simulated Ascend (``trainer.device=npu``).

What the test changes in the doc's lines, and why: ``<head-ip>`` is 127.0.0.1 and port 6379 a free port (the
machine is shared); every ``ray start`` also gets the flags a one-machine cluster needs (loopback address, free
agent ports, a small object store, a private temp dir, its CPU slots and a node name) and every command runs
under :mod:`verl.utils.testing.ray_loopback` (Ray would otherwise replace 127.0.0.1 by the routable address);
``<your overrides>`` are the CPU quickstart's and ``trainer.n_gpus_per_node=8`` becomes 1 (CPU slots, not NPUs);
``source recipes/qwen3_5/common.sh`` (CANN environment) is the NPU part left aside.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from verl.trainer import quickstart
from verl.utils.testing.local_ray_cluster import LocalRayCluster, free_port, local_ray_cluster, loopback_command

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "ascend.md"
LOOPBACK = "127.0.0.1"
CPU_SLOTS = {"node0": 2, "node1": 1}  # head: TaskRunner + one worker; node1: one worker
TRAIN = (  # and trainer.total_training_steps (2 unless a test says otherwise)
    "trainer.save_freq=2",
    "trainer.val_before_train=False",
    "trainer.test_freq=-1",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
)
# Metrics that measure time or speed; everything else must be bitwise equal.
_TIMING = re.compile(r"^(timing|perf|throughput)|time|/s$")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        RAY_AUTH_MODE="disabled",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for key in ("VERL_PLATFORM", "ASCEND_RT_VISIBLE_DEVICES", "RAY_RUNTIME_ENV_HOOK", "RAY_ADDRESS"):
        env.pop(key, None)
    return env


def _cluster_env() -> dict[str, str]:
    """Environment of every ``ray start``: no HCCL_/ASCEND_ variables, so what workers see of them came from the
    driver."""
    return {k: v for k, v in _env().items() if not k.startswith(("HCCL_", "ASCEND_"))}


# ------------------------------------------------------------------------------------------ the doc's lines


@dataclass
class DocLaunch:
    """The multi-node block of docs/ascend.md, split by role (each a list of argv tokens, env assignments first)."""

    head_start: list[str]
    node_start: list[str]
    wait: list[str]
    train: list[str]


def doc_launch() -> DocLaunch:
    """Parse the bash block after "**N nodes.**" in docs/ascend.md; an unknown command fails the test."""
    text = DOC.read_text()
    section = text[text.index("**N nodes.**") :]
    block = section[section.index("```bash") + len("```bash") : section.index("```", section.index("```bash") + 7)]
    found: dict[str, list[str]] = {}
    for line in block.strip().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "source recipes/qwen3_5/common.sh", "export VERL_NIC=")):
            continue  # comments; the CANN/HCCL environment and its NIC choice (the NPU part; here: loopback)
        tokens = shlex.split(line.replace("<your overrides>", "__OVERRIDES__"))
        command = tokens[len(_assignments(tokens)) :]
        if command[:3] == ["ray", "start", "--head"]:
            found["head_start"] = tokens
        elif command[:2] == ["ray", "start"]:
            found["node_start"] = tokens
        elif command[:4] == ["python", "-m", "verl.utils.ray_cluster", "wait"]:
            found["wait"] = tokens
        elif command[:3] == ["python", "-m", "verl.trainer.main_ppo"]:
            found["train"] = tokens
        else:
            raise AssertionError(f"docs/ascend.md runs a command this test does not know: {line!r}")
    return DocLaunch(**found)


def _assignments(tokens: list[str]) -> list[str]:
    """The leading ``NAME=value`` tokens of a shell command line (its environment assignments)."""
    count = 0
    while count < len(tokens) and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[count]):
        count += 1
    return tokens[:count]


def _localize(tokens: list[str], port: int) -> tuple[dict[str, str], list[str]]:
    """(env assignments, argv) with <head-ip> and <this-node-ip> -> 127.0.0.1 and 6379 -> ``port``; ``python -m X``
    under the loopback launcher."""
    tokens = [
        t.replace("<head-ip>", LOOPBACK).replace("<this-node-ip>", LOOPBACK).replace("6379", str(port)) for t in tokens
    ]
    env = dict(t.split("=", 1) for t in _assignments(tokens))
    argv = tokens[len(env) :]
    if argv[:2] == ["python", "-m"]:
        argv = loopback_command(argv[2], *argv[3:])
    return env, argv


def _training_argv(argv: list[str], assets: Path, run_dir: Path, *overrides: str) -> list[str]:
    """The doc's main_ppo line with the CPU quickstart in place of <your overrides> and CPU slots for NPUs."""
    if "trainer.n_gpus_per_node=8" not in argv or "__OVERRIDES__" not in argv:
        raise AssertionError(f"the doc's main_ppo line changed: {argv}")
    quick = quickstart.main_ppo_command(assets, [])[3:]  # --config-name quickstart_cpu, then the asset paths
    config_name, quick = quick[:2], [a for a in quick[2:] if not a.startswith(("trainer.log_dir=", "trainer.default_"))]
    run = [f"trainer.log_dir={run_dir / 'logs'}", f"trainer.default_local_dir={run_dir / 'ckpt'}"]
    out = []
    for arg in argv:
        if arg == "verl.trainer.main_ppo":
            out += [arg, *config_name]  # Hydra's options come before the overrides
        elif arg == "trainer.n_gpus_per_node=8":
            out.append("trainer.n_gpus_per_node=1")
        elif arg == "__OVERRIDES__":
            out += [*quick, *run, "ray_kwargs.ray_init.num_cpus=null", *overrides]
        else:
            out.append(arg)
    return out


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart")
    quickstart.prepare(out)
    return out


@dataclass
class Cluster:
    ray: LocalRayCluster
    doc: DocLaunch
    port: int


@pytest.fixture(scope="module")
def doc_cluster():
    """The two-node cluster, started with the doc's ``ray start`` lines and awaited with its readiness line."""
    doc, port = doc_launch(), free_port()
    cluster = LocalRayCluster(env=_cluster_env())
    try:
        _, head = _localize(doc.head_start, port)
        extra = [f"--temp-dir={cluster.temp_dir}", *cluster.head_port_args()]
        cluster.run_ray_start("node0", True, [*head[2:], *extra, *cluster.node_args(CPU_SLOTS["node0"], None, "node0")])
        _, node = _localize(doc.node_start, port)
        node_flags = [*cluster.node_args(CPU_SLOTS["node1"], None, "node1"), *cluster.worker_node_args()]
        cluster.run_ray_start("node1", False, [*node[2:], *node_flags])
        env, wait = _localize(doc.wait, port)
        ready = subprocess.run(wait, env={**_env(), **env}, capture_output=True, text=True, timeout=700)
        assert ready.returncode == 0, f"the doc's readiness wait failed:\n{ready.stdout}\n{ready.stderr[-3000:]}"
        assert "Ray cluster ready: 2 alive node(s)" in ready.stdout
        yield Cluster(cluster, doc, port)
    finally:
        cluster.shutdown()
    assert cluster.surviving_pids() == [], "Ray processes of the test cluster survived its teardown"


# ------------------------------------------------------------------------------------------ running main_ppo


def _run(argv: list[str], env: dict[str, str] | None = None, timeout_s: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, env={**_env(), **(env or {})}, cwd=REPO, capture_output=True, text=True, timeout=timeout_s
    )


def _train(argv: list[str], env: dict[str, str] | None = None) -> str:
    result = _run(argv, env)
    if result.returncode != 0:
        raise AssertionError(
            f"main_ppo failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
        )
    return result.stdout + result.stderr


def train_on_doc_cluster(cluster: Cluster, assets: Path, run_dir: Path, *overrides: str, launch=()) -> str:
    env, argv = _localize(cluster.doc.train, cluster.port)
    argv = _training_argv(argv, assets, run_dir, *TRAIN, "trainer.total_training_steps=2", *overrides)
    if launch:  # e.g. the simulated Ascend launcher in front of the module
        module_at = argv.index("verl.trainer.main_ppo")
        argv = [*argv[:module_at], *launch, *argv[module_at:]]
    return _train(argv, env)


def train_on_one_node(assets: Path, run_dir: Path, *overrides: str, launch=(), steps: int = 2) -> str:
    """The reference: one local Ray node (on 127.0.0.1), world size 2 (``n_gpus_per_node=2``)."""
    command = quickstart.main_ppo_command(
        assets,
        [
            f"trainer.default_local_dir={run_dir / 'ckpt'}",
            *TRAIN,
            f"trainer.total_training_steps={steps}",
            "trainer.n_gpus_per_node=2",
            "ray_kwargs.ray_init.num_cpus=3",
            f"+ray_kwargs.ray_init._node_ip_address={LOOPBACK}",
            *overrides,
        ],
    )
    command = [a if not a.startswith("trainer.log_dir=") else f"trainer.log_dir={run_dir / 'logs'}" for a in command]
    return _train(loopback_command(*launch, *command[2:]))


def _metrics(run_dir: Path) -> dict[int, dict]:
    by_step: dict[int, dict] = {}
    for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record["data"])
    return by_step


def placement(output: str) -> list[str]:
    """Node names of ranks 0, 1, ... from the driver's ``[verl] worker placement:`` line."""
    line = next(ln for ln in output.splitlines() if "[verl] worker placement:" in ln)
    return re.findall(r"rank \d+ -> \S+ \(name (\w+)", line)


def checkpoint_tensors(step_dir: Path) -> dict[str, object]:
    """Every tensor of an actor checkpoint, read by torch's own DCP reader (model and optimizer, flattened)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat: dict[str, object] = {}
    for part in ("model_dcp", "optim_dcp"):
        target = step_dir / f"{part}.pt"
        dcp_to_torch_save(step_dir / "actor" / part, target)
        _flatten(part, torch.load(target, weights_only=False), flat)
    return flat


def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}", item, out)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _flatten(f"{prefix}.{i}", item, out)
    else:
        out[prefix] = value


def assert_same_run(two_nodes: Path, one_node: Path) -> None:
    """Every non-timing metric of every step, and every checkpoint tensor, bitwise equal."""
    import torch

    multi, single = _metrics(two_nodes), _metrics(one_node)
    assert sorted(multi) == sorted(single) == [1, 2]
    for step in (1, 2):
        compared = [k for k in single[step] if not _TIMING.search(k)]
        assert "actor/pg_loss" in compared and "critic/score/mean" in compared
        differ = {k: (multi[step].get(k), single[step][k]) for k in compared if multi[step].get(k) != single[step][k]}
        assert not differ, f"step {step}: metrics differ between two nodes and one node: {differ}"
    a, b = (
        checkpoint_tensors(two_nodes / "ckpt" / "global_step_2"),
        checkpoint_tensors(one_node / "ckpt" / "global_step_2"),
    )
    assert a.keys() == b.keys() and any(isinstance(v, torch.Tensor) for v in a.values())
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), f"checkpoint tensor {key} differs"
        else:
            assert value == b[key], f"checkpoint entry {key} differs"


# ------------------------------------------------------------------------------------------ tests


def test_doc_launch_trains_on_two_nodes_like_one(doc_cluster, assets, tmp_path):
    """The doc's launch: one rank per node (rank 0 on the head), same metrics and checkpoint as one node."""
    output = train_on_doc_cluster(doc_cluster, assets, tmp_path / "two")
    assert placement(output) == ["node0", "node1"]
    train_on_one_node(assets, tmp_path / "one")
    assert_same_run(tmp_path / "two", tmp_path / "one")


def test_readiness_wait_names_what_is_missing(doc_cluster):
    """``wait`` for a third node or for more NPUs than a node has exits 1 after its timeout, naming the gap."""
    address = f"--address={LOOPBACK}:{doc_cluster.port}"
    wait = loopback_command("verl.utils.ray_cluster", "wait", address, "--timeout", "2")
    more_nodes = _run([*wait, "--nodes", "3"], timeout_s=300)
    assert more_nodes.returncode == 1
    assert "Ray sees 2 of 3 node(s)" in more_nodes.stderr and "1 more node(s) must join" in more_nodes.stderr
    more_npus = _run([*wait, "--nodes", "2", "--resource", "NPU=9", "--resource", "CPU=1"], timeout_s=300)
    assert more_npus.returncode == 1
    assert "Ray sees 0 of 2 node(s) with CPU 1, NPU 9" in more_npus.stderr
    for name in ("node0", "node1"):
        assert re.search(rf"name {name}, node id \w+(, head)?\) has only NPU 8 of the 9 needed", more_npus.stderr)


def test_too_small_cluster_is_refused_before_any_worker(doc_cluster, assets, tmp_path):
    """nnodes=2 x n_gpus_per_node=2 on nodes of 2 and 1 CPU slots: refused, naming node1 and the CPU it lacks."""
    env, argv = _localize(doc_cluster.doc.train, doc_cluster.port)
    argv = _training_argv(argv, assets, tmp_path, *TRAIN, "trainer.total_training_steps=2")
    swap = {
        "trainer.n_gpus_per_node=1": "trainer.n_gpus_per_node=2",  # 4 ranks: 16 responses each
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    }
    argv = [swap.get(a, a) for a in argv]
    result = _run(argv, env, timeout_s=600)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "the resource pool needs 4 CPU in total but the Ray cluster has 3" in output, output[-4000:]
    assert "pool node 1 needs CPU 2 on one Ray node" in output
    assert re.search(r"name node1, node id \w+\) has only CPU 1 of the 2 needed", output), output[-4000:]
    assert "(WorkerDict pid=" not in output and "[verl] worker placement" not in output


_ENV_PROBE = """
import json, os, sys

import ray
from omegaconf import OmegaConf

from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.trainer.main_ppo import init_ray


class EnvProbe(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def report(self, prefixes):
        env = {k: v for k, v in os.environ.items() if k.startswith(tuple(prefixes))}
        context = ray.get_runtime_context()
        return {"env": env, "node_id": context.get_node_id(), "npu_ids": context.get_accelerator_ids().get("NPU")}


init_ray(OmegaConf.create({"ray_kwargs": {"ray_init": {"address": sys.argv[1]}}}))  # the trainer's ray.init
group = RayWorkerGroup(
    RayResourcePool([2, 2], max_colocate_count=1), RayClassWithInitArgs(ray.remote(EnvProbe)), device_name="npu"
)
reports = group.report(["HCCL_", "ASCEND_", "RANK", "LOCAL_RANK", "MASTER_ADDR"])
print("PROBE " + json.dumps({"nodes": group.worker_node_ids, "reports": reports}))
"""


def test_workers_of_node2_see_forwarded_env_and_own_devices(tmp_path):
    """Two nodes of 2 NPUs, a group of 2 + 2 ranks on the simulated-Ascend resources: the ranks on node1 see the
    driver's HCCL_/ASCEND_ variables (node1's ``ray start`` never had them) and the NPU id Ray gave each of them
    (0 and 1, never the driver's ASCEND_RT_VISIBLE_DEVICES=5,6; equal to the NPU ids Ray records for that actor);
    the cluster then shuts down without survivors."""
    script = tmp_path / "probe.py"
    script.write_text(_ENV_PROBE)
    driver_env = {
        "HCCL_CONNECT_TIMEOUT": "777",
        "HCCL_PROBE_FROM_DRIVER": "hccl-value",
        "ASCEND_PROBE_FROM_DRIVER": "ascend-value",
        "ASCEND_RT_VISIBLE_DEVICES": "5,6",  # the driver's own visibility: never copied to workers
    }
    with local_ray_cluster([(3, {"NPU": 2}), (2, {"NPU": 2})], env=_cluster_env()) as cluster:
        node_ids = {n.name: n.node_id for n in cluster.nodes}
        result = _run(loopback_command(str(script), cluster.address), driver_env, timeout_s=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        seen = json.loads(next(ln for ln in result.stdout.splitlines() if ln.startswith("PROBE "))[6:])
        assert cluster.surviving_pids(), "the cluster's processes must be visible before the shutdown"
    # local_ray_cluster's exit: every process of both nodes SIGKILLed by pid, and none survives (else it raises)
    assert cluster.surviving_pids() == []
    assert seen["nodes"] == [node_ids["node0"]] * 2 + [node_ids["node1"]] * 2
    reports = seen["reports"]
    for rank, report in enumerate(reports):
        env = report["env"]
        assert report["node_id"] == seen["nodes"][rank]
        assert (env["RANK"], env["LOCAL_RANK"], env["MASTER_ADDR"]) == (str(rank), str(rank % 2), LOOPBACK)
        assert env["HCCL_PROBE_FROM_DRIVER"] == "hccl-value" and env["ASCEND_PROBE_FROM_DRIVER"] == "ascend-value"
        assert env["HCCL_CONNECT_TIMEOUT"] == "777"  # the user's value wins over the platform default (1500)
        assert env["HCCL_HOST_SOCKET_PORT_RANGE"] == "auto"  # the platform's collective settings reach node1 too
        # the visibility a worker reads is the NPU Ray assigned to that very actor (Ray's own record of it)
        assert env["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(report["npu_ids"]), report
    node1_devices = sorted(reports[r]["env"]["ASCEND_RT_VISIBLE_DEVICES"] for r in (2, 3))
    assert node1_devices == ["0", "1"], node1_devices  # each rank its own NPU of node1, assigned by Ray


# ------------------------------------------------------------------------------------------ slow variants


@pytest.mark.slow
def test_engine_worker_path_on_two_nodes_like_one(doc_cluster, assets, tmp_path):
    """trainer.use_legacy_worker_impl=disable (engine workers) through the doc's launch: same as one node."""
    engine = "trainer.use_legacy_worker_impl=disable"
    output = train_on_doc_cluster(doc_cluster, assets, tmp_path / "two", engine)
    assert placement(output) == ["node0", "node1"]
    train_on_one_node(assets, tmp_path / "one", engine)
    assert_same_run(tmp_path / "two", tmp_path / "one")


def npu_sim(devices: int) -> tuple[str, ...]:
    """The simulated-Ascend launcher; ``devices``: the NPUs a local Ray node started by the driver advertises."""
    return ("verl.utils.platform.npu_sim.launch", "--devices", str(devices))


@pytest.mark.slow
def test_simulated_npu_on_two_nodes_like_one(doc_cluster, assets, tmp_path):
    """trainer.device=npu on the simulated Ascend: the nodes' declared NPU resources place one rank per node,
    every worker builds its model for the npu platform, and the run equals the one-node simulated run."""
    output = train_on_doc_cluster(doc_cluster, assets, tmp_path / "two", "trainer.device=npu", launch=npu_sim(1))
    assert placement(output) == ["node0", "node1"]
    assert set(re.findall(r"\[verl patch\] model_type=\S+ platform=(\w+)", output)) == {"npu"}
    train_on_one_node(assets, tmp_path / "one", "trainer.device=npu", launch=npu_sim(2))
    assert_same_run(tmp_path / "two", tmp_path / "one")


# ------------------------------------------------------------------------------------------ losing a node

TWO_NODES = [(CPU_SLOTS["node0"], None), (CPU_SLOTS["node1"], None)]
FOUR_STEPS = ("trainer.total_training_steps=4", *TRAIN)
# The bound this test holds the driver to after the kill: Ray's notice of the closed connection (seconds), the
# driver's wait for the GCS to declare the node dead (NODE_DEATH_WAIT_S = 30 s), the exit; with margin for a
# loaded 2-core machine. A driver still running after it has hung.
DRIVER_EXIT_BOUND_S = 120


def _two_node_command(assets: Path, run_dir: Path, *overrides: str) -> list[str]:
    command = quickstart.main_ppo_command(
        assets,
        [
            f"trainer.default_local_dir={run_dir / 'ckpt'}",
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=1",
            "ray_kwargs.ray_init.num_cpus=null",
            *overrides,
        ],
    )
    command = [a if not a.startswith("trainer.log_dir=") else f"trainer.log_dir={run_dir / 'logs'}" for a in command]
    return loopback_command(*command[2:])


def _wait_for_step(process: subprocess.Popen, run_dir: Path, step: int, timeout_s: float = 900) -> None:
    """Until metrics.jsonl has ``step`` (logged after that step's checkpoint, so step + 1 is under way)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = run_dir / "logs" / "metrics.jsonl"
        if path.is_file() and step in _metrics(run_dir):
            return
        if process.poll() is not None:
            raise AssertionError(f"the run ended (rc={process.returncode}) before step {step}")
        time.sleep(0.5)
    raise AssertionError(f"step {step} not logged within {timeout_s:g}s")


@pytest.mark.slow
def test_node_loss_stops_the_driver_and_resume_reproduces_the_run(assets, tmp_path):
    """Kill node1 (raylet, agents, workers: SIGKILL by pid) during step 3 of a 4-step two-node run that
    checkpointed step 2. The driver exits non-zero within DRIVER_EXIT_BOUND_S naming node1 and the step-2
    checkpoint; a rerun with trainer.resume_mode=auto on a fresh two-node cluster resumes from it with the same
    rank -> node mapping, and its steps 3-4 equal the uninterrupted run (one node, same world size: equal to two
    nodes by test_doc_launch_trains_on_two_nodes_like_one)."""
    reference, run = tmp_path / "reference", tmp_path / "run"
    train_on_one_node(assets, reference, steps=4)
    log = tmp_path / "killed.log"
    with local_ray_cluster(TWO_NODES, env=_cluster_env()) as cluster, open(log, "w") as out:
        env = {**_env(), "RAY_ADDRESS": cluster.address}
        process = subprocess.Popen(
            _two_node_command(assets, run, *FOUR_STEPS), env=env, cwd=REPO, stdout=out, stderr=out
        )
        try:
            _wait_for_step(process, run, 2)
            killed = cluster.kill_node("node1")
            started = time.monotonic()
            returncode = process.wait(timeout=DRIVER_EXIT_BOUND_S)
            exit_s = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.kill()
    output = log.read_text()
    print(f"driver exited {exit_s:.1f}s after node1's {len(killed)} processes were killed", flush=True)
    assert returncode != 0
    node1 = next(n for n in cluster.nodes if n.name == "node1")
    assert f"WorkerLostError: node 127.0.0.1 (name node1, node id {node1.node_id[:8]}) was lost" in output, output[
        -6000:
    ]
    assert "was lost (" in output and "): it ran rank 1 of 2 of the worker group" in output
    assert f"The last complete checkpoint is {run / 'ckpt' / 'global_step_2'} (global step 2)" in output
    assert "trainer.resume_mode=auto" in output
    assert sorted(_metrics(run)) == [1, 2]
    first_placement = placement(output)

    with local_ray_cluster(TWO_NODES, env=_cluster_env()) as cluster:
        resumed = _train(
            _two_node_command(assets, run, *FOUR_STEPS, "trainer.resume_mode=auto"), {"RAY_ADDRESS": cluster.address}
        )
    assert f"[verl] resuming from {run / 'ckpt' / 'global_step_2'} (global step 2)" in resumed
    assert placement(resumed) == first_placement == ["node0", "node1"]
    expected, got = _metrics(reference), _metrics(run)
    worst = 0.0
    for step in (3, 4):
        compared = [k for k in expected[step] if not _TIMING.search(k)]
        assert "actor/pg_loss" in compared
        for key in compared:
            worst = max(worst, abs(got[step][key] - expected[step][key]))
            assert got[step][key] == expected[step][key], (step, key, got[step][key], expected[step][key])
    print(f"resumed steps 3-4 vs the uninterrupted run: max |diff| over all metrics = {worst:g}", flush=True)
