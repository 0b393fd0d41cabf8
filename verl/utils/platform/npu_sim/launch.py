"""Run a program on a simulated Ascend *machine*: ``python -m verl.utils.platform.npu_sim.launch MODULE [ARGS...]``.

For example, what CI runs to train with ``trainer.device=npu`` without an NPU::

    python -m verl.utils.platform.npu_sim.launch verl.trainer.main_ppo trainer.device=npu ...

The command after ``launch`` is exactly the one a user runs on an Ascend node; the launcher only makes this machine
look like one, in every process the program starts through Ray:

* this process (the driver): the simulated device, ``torch_npu`` and ``hccl`` (:func:`~.install`), before
  ``MODULE`` is imported, so ``validate_device("npu")`` accepts it;
* Ray: a stand-in for AscendCL's device query (the ``acl`` module Ray asks for the node's NPU count), so
  ``ray.init()`` advertises ``NPU`` resources as on a real node (one per visible simulated device);
* every Ray worker process: ``RAY_RUNTIME_ENV_HOOK`` adds :func:`~.ray_worker_setup_hook` as the job's
  ``worker_process_setup_hook``, so the simulation is installed in each worker before it runs user code.

The number of devices is ``--devices N`` (default: the ids in ``ASCEND_RT_VISIBLE_DEVICES``, else 8, one
Atlas 800T A2 node). Test fixture: never imported by verl at run time.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import types
from typing import Any

from verl.utils.platform.npu_sim import install

RUNTIME_ENV_HOOK_ENV = "RAY_RUNTIME_ENV_HOOK"  # ray._private.ray_constants.RAY_RUNTIME_ENV_HOOK
SETUP_HOOK = "verl.utils.platform.npu_sim.ray_worker_setup_hook"
RUNTIME_ENV_HOOK = "verl.utils.platform.npu_sim.launch.ray_runtime_env_hook"
DEFAULT_DEVICES_PER_NODE = 8
SOC_NAME = "Ascend910B"


def ray_runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """Ray's ``RAY_RUNTIME_ENV_HOOK``: the job's runtime env, plus the simulator's worker setup hook.

    A different ``worker_process_setup_hook`` already configured by the program is an error (Ray runs one hook;
    silently replacing either would leave workers without the simulation or without the program's setup).
    """
    env = dict(runtime_env or {})
    existing = env.get("worker_process_setup_hook")
    if existing not in (None, SETUP_HOOK):
        raise RuntimeError(
            f"runtime_env.worker_process_setup_hook={existing!r} is set; the simulated Ascend needs {SETUP_HOOK!r} "
            "there. Call the simulator's hook from yours, or drop yours for the simulated run."
        )
    env["worker_process_setup_hook"] = SETUP_HOOK
    return env


def fake_acl(device_count: int) -> types.ModuleType:
    """The two AscendCL calls Ray makes to size a node (``acl.rt.get_device_count``, ``acl.get_soc_name``)."""
    acl = types.ModuleType("acl")
    acl.__doc__ = "simulated AscendCL: device count and SoC name only (verl.utils.platform.npu_sim.launch)"
    acl.rt = types.SimpleNamespace(get_device_count=lambda: (device_count, 0))  # (count, ACL_SUCCESS)
    acl.get_soc_name = lambda: SOC_NAME
    return acl


def _device_count(requested: int | None) -> int:
    if requested is not None:
        return requested
    visible = [v for v in os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return len(visible) or DEFAULT_DEVICES_PER_NODE


def simulate_machine(device_count: int) -> None:
    """Make this process, and the Ray cluster it starts, an Ascend node with ``device_count`` simulated NPUs."""
    existing_hook = os.environ.get(RUNTIME_ENV_HOOK_ENV)
    if existing_hook not in (None, RUNTIME_ENV_HOOK):
        raise RuntimeError(f"{RUNTIME_ENV_HOOK_ENV}={existing_hook} is already set; unset it for the simulated run")
    install(device_count)
    sys.modules.setdefault("acl", fake_acl(device_count))
    os.environ[RUNTIME_ENV_HOOK_ENV] = RUNTIME_ENV_HOOK


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=None, help="simulated NPUs on this node")
    parser.add_argument("module", help="module to run as __main__, e.g. verl.trainer.main_ppo")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments, unchanged")
    args = parser.parse_args(argv)
    simulate_machine(_device_count(args.devices))
    sys.argv = [args.module, *args.args]
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
