"""RL datasets (upstream ``verl.utils.dataset``): ``RLHFDataset`` over parquet prompts and its ``collate_fn``.

Attributes resolve lazily so that importing the package does not import torch or pyarrow.
"""

__all__ = ["RLHFDataset", "collate_fn", "RLDatasetConfig"]


def __getattr__(name: str):
    if name in ("RLHFDataset", "collate_fn"):
        from verl.utils.dataset import rl_dataset

        return getattr(rl_dataset, name)
    if name == "RLDatasetConfig":
        from verl.utils.dataset.dataset_config import RLDatasetConfig

        return RLDatasetConfig
    raise AttributeError(f"module 'verl.utils.dataset' has no attribute {name!r}")
