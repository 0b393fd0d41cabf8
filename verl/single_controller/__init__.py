"""The single controller: one driver process calls methods on groups of worker processes.

* ``verl.single_controller.base``: ``Worker``, ``WorkerGroup``, ``ResourcePool``, ``ClassWithInitArgs``;
  ``base.decorator``: ``@register``, ``Dispatch``, ``Execute``.
* ``verl.single_controller.ray``: the Ray backend (``RayResourcePool``, ``RayWorkerGroup``, ...).
* ``verl.single_controller.local``: ``LocalWorkerGroup``, the same dispatch in this process, for debugging.

Importing this package does not import Ray.
"""

from verl.single_controller.base import ClassWithInitArgs, ResourcePool, Worker, WorkerGroup

__all__ = ["ClassWithInitArgs", "ResourcePool", "Worker", "WorkerGroup"]
