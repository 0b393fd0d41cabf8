"""verl.utils' upstream package-level helpers: ``from verl.utils import omega_conf_to_dataclass`` and the group-wise
statistics (``as_torch_index``, ``group_mean_std``) user estimators call."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from verl.utils import as_torch_index, group_mean_std


def test_package_level_names_resolve_to_their_modules():
    """``from verl.utils import X`` gives the same object as the defining module (upstream re-exports them)."""
    from verl.utils import config, groupwise, hf_processor, hf_tokenizer, omega_conf_to_dataclass, tokenizer

    assert omega_conf_to_dataclass is config.omega_conf_to_dataclass
    assert (hf_tokenizer, hf_processor) == (tokenizer.hf_tokenizer, tokenizer.hf_processor)
    assert (as_torch_index, group_mean_std) == (groupwise.as_torch_index, groupwise.group_mean_std)
    with pytest.raises(ImportError, match="not_a_helper"):
        from verl.utils import not_a_helper  # noqa: F401


def test_importing_verl_utils_stays_light():
    """The re-exports are lazy: importing verl.utils (as verl.utils.device does) loads neither transformers nor
    OmegaConf."""
    code = "import sys, verl.utils.device; print([m for m in ('transformers', 'omegaconf') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "labels, expected",
    [
        ([7, 3, 7, 9], [1, 0, 1, 2]),  # numbered in sorted label order
        (np.array(["b", "a", "b"], dtype=object), [1, 0, 1]),  # uid strings
        (torch.tensor([5, -1, 5]), [1, 0, 1]),  # negative labels still give ids 0..G-1
    ],
)
def test_as_torch_index_dense_ids(labels, expected):
    ids = as_torch_index(labels)
    assert ids.dtype == torch.long and ids.tolist() == expected


def test_group_mean_std_worked_example():
    """scores [1, 3, 5, 2], groups [0, 0, 1, 2]: group 0 has mean 2 and unbiased std sqrt(((1-2)² + (3-2)²)/1) =
    sqrt(2); groups 1 and 2 are singletons -> mean 0, std 1. Counts [2, 1, 1]."""
    mean, std, count = group_mean_std(torch.tensor([1.0, 3.0, 5.0, 2.0]), torch.tensor([0, 0, 1, 2]))
    assert mean.tolist() == [2.0, 0.0, 0.0]
    assert std[0].item() == pytest.approx(math.sqrt(2), rel=1e-6) and std[1:].tolist() == [1.0, 1.0]
    assert count.tolist() == [2.0, 1.0, 1.0]


def test_group_mean_std_floors_the_variance_and_checks_ids():
    """Identical scores give variance 0, floored at eps: std = sqrt(eps). Non-dense ids are refused."""
    _, std, _ = group_mean_std(torch.tensor([4.0, 4.0]), torch.tensor([0, 0]), eps=1e-4)
    assert std.item() == pytest.approx(1e-2, rel=1e-5)
    with pytest.raises(ValueError, match="dense ids"):
        group_mean_std(torch.tensor([1.0]), torch.tensor([-1]))
    with pytest.raises(ValueError, match="2 scores but 1 group ids"):
        group_mean_std(torch.tensor([1.0, 2.0]), torch.tensor([0]))
