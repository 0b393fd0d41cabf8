"""Run a Ray program with the loopback address kept as the node address: ``python -m
verl.utils.testing.ray_loopback PROGRAM [ARGS...]`` — a **test fixture**, never imported by verl at run time.

``PROGRAM`` is ``ray`` (Ray's own CLI: ``ray start``, ``ray status``), a script ``*.py``, or a module run as
``__main__`` exactly as ``python -m MODULE ARGS`` would (``verl.trainer.main_ppo``, ``verl.utils.ray_cluster``, or another launcher such as
``verl.utils.platform.npu_sim.launch`` followed by its own program)::

    python -m verl.utils.testing.ray_loopback ray start --head --node-ip-address=127.0.0.1 --port=6379
    python -m verl.utils.testing.ray_loopback verl.trainer.main_ppo ray_kwargs.ray_init.address=127.0.0.1:6379 ...

Why it exists: Ray rewrites a loopback address (``127.0.0.1``, ``localhost``) given as ``--node-ip-address``,
``--address`` or ``ray.init(address=...)`` into the host's routable address
(``ray._private.services.resolve_ip_for_localhost``), because a real cluster's nodes must reach each other. Tests
here must never listen on or talk to anything but 127.0.0.1, so a multi-node cluster on one machine (several
raylets, each its own node with its own resources) needs every Ray client and node of the test to keep the address
it was given. This launcher changes exactly that one function, in this process only; the node processes Ray starts
and the workers they fork get the loopback address on their command lines and need nothing. Everything else is
the real Ray: GCS, raylets, placement groups, actors, node-failure detection.
"""

from __future__ import annotations

import runpy
import sys


def keep_loopback_addresses() -> None:
    """Make Ray keep ``127.0.0.1`` / ``localhost`` as given instead of replacing them by the routable address."""
    import ray._private.services as services

    services.resolve_ip_for_localhost = _as_given


def _as_given(host: str) -> str:
    if not host:
        raise ValueError(f"Malformed host: {host!r}")
    return host


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0])
        raise SystemExit(0 if argv else 2)
    keep_loopback_addresses()
    program, args = argv[0], argv[1:]
    if program == "ray":
        from ray.scripts.scripts import main as ray_cli

        sys.argv = ["ray", *args]
        ray_cli()
        return
    sys.argv = [program, *args]
    if program.endswith(".py"):
        runpy.run_path(program, run_name="__main__")
    else:
        runpy.run_module(program, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
