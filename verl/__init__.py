"""verl-ascend: the verl RL trainer for Qwen3.5 on Ascend NPUs, CUDA GPUs and the CPU.

`import verl` patches nothing, reads no environment variable and imports neither Ray, transformers nor vLLM.
`verl.DataProto` is resolved on first access. Its one action is to append the import finder of
`verl.upstream_gaps` to `sys.meta_path`: it answers only for upstream verl modules this distribution does not
provide, after every normal finder failed, and turns the bare ModuleNotFoundError into one that says why.
"""

from importlib import resources as _resources

from verl.upstream_gaps import install_import_hook as _install_import_hook

_install_import_hook()

__version__ = _resources.files("verl").joinpath("version").read_text().strip()

__all__ = ["DataProto", "__version__"]


def __getattr__(name: str):
    if name == "DataProto":
        from verl.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'verl' has no attribute {name!r}")
