"""`python -m verl.model_merger` on upstream verl's FSDP checkpoint layout and its `test` subcommand.

The fixture is written the way upstream's FSDP checkpoint manager writes it: one `torch.save`d state dict per rank,
`model_world_size_2_rank_{r}.pt`, each value that rank's `Shard(0)` piece as a DTensor (FSDP2) -- or, for the
older FSDP1 format, a plain tensor holding a dim-0 split. The DTensors are built in a subprocess with a one-rank
gloo group (the pieces claim the global shape of a 2-way split), so no process group leaks into pytest. The
reference is the tiny model's own `state_dict()`, before sharding.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from verl.model_merger.__main__ import main as merger_main
from verl.model_merger.fsdp_layout import find_upstream_shards

_WRITE_DTENSOR_SHARDS = r"""
import sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
full_path, out_dir, store = sys.argv[1:4]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
full = torch.load(full_path)
for rank in range(2):
    shard = {}
    for name, tensor in full.items():
        local = torch.chunk(tensor, 2, dim=0)[rank].clone()
        shard[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=tensor.shape,
                                         stride=tensor.stride())
    torch.save(shard, f"{out_dir}/model_world_size_2_rank_{rank}.pt")
dist.destroy_process_group()
"""


def _tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3ForCausalLM"]  # as in every saved checkpoint's config.json
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _upstream_checkpoint(tmp_path: Path, model, dtensor: bool) -> Path:
    ckpt = tmp_path / "actor"
    (ckpt / "huggingface").mkdir(parents=True)
    model.config.save_pretrained(ckpt / "huggingface")
    full = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    if dtensor:
        torch.save(full, tmp_path / "full.pt")
        subprocess.run(
            [sys.executable, "-c", _WRITE_DTENSOR_SHARDS, str(tmp_path / "full.pt"), str(ckpt), str(tmp_path / "pg")],
            check=True,
            capture_output=True,
            timeout=120,
        )
    else:
        for rank in range(2):
            shard = {name: torch.chunk(t, 2, dim=0)[rank].clone() for name, t in full.items()}
            torch.save(shard, ckpt / f"model_world_size_2_rank_{rank}.pt")
    return ckpt


@pytest.mark.parametrize("dtensor", [True, False], ids=["fsdp2_dtensor", "fsdp1_plain"])
def test_upstream_layout_merges_to_the_original_weights(tmp_path, dtensor):
    model = _tiny_model()
    ckpt = _upstream_checkpoint(tmp_path, model, dtensor)
    assert (
        merger_main(["merge", "--backend", "fsdp", "--local_dir", str(ckpt), "--target_dir", str(tmp_path / "hf")]) == 0
    )
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    reference = model.state_dict()
    assert sorted(merged) == sorted(reference)
    for name, tensor in reference.items():
        assert torch.equal(merged[name], tensor), name


def test_test_subcommand_passes_on_equal_weights_and_names_the_difference(tmp_path, capsys):
    model = _tiny_model()
    ckpt = _upstream_checkpoint(tmp_path, model, dtensor=False)
    model.save_pretrained(tmp_path / "same")
    assert merger_main(["test", "--local_dir", str(ckpt), "--test_hf_dir", str(tmp_path / "same")]) == 0
    assert "ok:" in capsys.readouterr().out
    with torch.no_grad():
        model.model.norm.weight.add_(0.5)
    model.save_pretrained(tmp_path / "other")
    assert merger_main(["test", "--local_dir", str(ckpt), "--test_hf_dir", str(tmp_path / "other")]) == 1
    assert "model.norm.weight: max |difference| 0.5" in capsys.readouterr().err


def test_incomplete_shard_set_names_the_missing_rank(tmp_path):
    ckpt = _upstream_checkpoint(tmp_path, _tiny_model(), dtensor=False)
    (ckpt / "model_world_size_2_rank_1.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"model_world_size_2_rank_\{\[1\]\}\.pt missing"):
        find_upstream_shards(ckpt)


def test_trust_remote_code_flag_is_accepted(tmp_path):
    ckpt = _upstream_checkpoint(tmp_path, _tiny_model(), dtensor=False)
    args = ["merge", "--local_dir", str(ckpt), "--target_dir", str(tmp_path / "hf"), "--trust-remote-code"]
    assert merger_main(args) == 0 and (tmp_path / "hf" / "config.json").is_file()
