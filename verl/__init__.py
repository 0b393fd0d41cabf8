"""verl-ascend: the verl RL trainer for Qwen3.5 on Ascend NPUs, CUDA GPUs and the CPU.

`import verl` has no side effects: it patches nothing, reads no environment variable and imports neither
Ray, transformers nor vLLM. `verl.DataProto` is resolved on first access.
"""

from importlib import resources as _resources

__version__ = _resources.files("verl").joinpath("version").read_text().strip()

__all__ = ["DataProto", "__version__"]


def __getattr__(name: str):
    if name == "DataProto":
        from verl.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'verl' has no attribute {name!r}")
