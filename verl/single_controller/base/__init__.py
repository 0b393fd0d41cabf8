"""Backend-independent single-controller pieces: ``Worker``, ``WorkerGroup``, ``ResourcePool``,
``ClassWithInitArgs`` and the ``@register`` decorator (``decorator.py``)."""

from verl.single_controller.base.worker import Worker
from verl.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup

__all__ = ["ClassWithInitArgs", "ResourcePool", "Worker", "WorkerGroup"]
