"""Probe: how far the real ``veomni`` (0.1.12) gets with its Qwen3.5-MoE path on a CPU with gloo.

Environment (not part of ``make test``; see docs/veomni.md)::

    python3 -m venv /tmp/venv-veomni
    /tmp/venv-veomni/bin/pip install -c constraints-cpu.txt torch==2.13.0 veomni==0.1.12 transformers==5.9.0 -e .
    cp envs/vllm_cpu/verl_torchvision_cpu_ops.py "$SITE"/ && echo 'import verl_torchvision_cpu_ops' > "$SITE"/x.pth

Run: ``/tmp/venv-veomni/bin/python envs/veomni_cpu/probe_qwen3_5_moe.py /tmp/ckpt`` (a tiny checkpoint is written
there first). Each step prints OK or FAIL with the exception; the first FAIL ends the probe.
"""

import os
import sys
import traceback

import torch
import torch.distributed as dist

from verl.models.tiny import save_tiny_checkpoint
from verl.utils.tokenizer import build_offline_tokenizer


def _step(name, fn):
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - a probe reports every failure and stops
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        traceback.print_exc(limit=4)
        dist.destroy_process_group()
        sys.exit(1)
    print(f"OK   {name}", flush=True)
    return out


def main(path: str) -> None:
    from veomni.arguments.arguments_types import MixedPrecisionConfig, OpsImplementationConfig
    from veomni.distributed.parallel_state import init_parallel_state
    from veomni.distributed.torch_parallelize import build_parallelize_model
    from veomni.models.auto import build_foundation_model

    tokenizer = build_offline_tokenizer([f"Q: {i} plus {i}? A: {2 * i}" for i in range(100)], vocab_size=300)
    save_tiny_checkpoint("qwen3_5_moe", tokenizer, path)
    world = dist.get_world_size()
    _step("init_parallel_state", lambda: init_parallel_state(dp_size=world, dp_shard_size=world, device_type="cpu"))
    eager = {
        f"{op}_implementation": "eager"
        for op in (
            "moe",
            "cross_entropy_loss",
            "rms_norm",
            "swiglu_mlp",
            "rotary_pos_emb",
            "load_balancing_loss",
            "rms_norm_gated",
            "causal_conv1d",
            "chunk_gated_delta_rule",
        )
    }
    ops = OpsImplementationConfig(attn_implementation="sdpa", **eager)
    model = _step(
        "build_foundation_model",
        lambda: build_foundation_model(
            path, path, torch_dtype="float32", attn_implementation="sdpa", init_device="cpu", ops_implementation=ops
        ),
    )
    ids = torch.randint(5, 250, (1, 24), generator=torch.Generator().manual_seed(0))
    cu = torch.tensor([0, 10, 24], dtype=torch.int32)  # two packed sequences, 10 + 14 tokens
    packed = dict(
        position_ids=torch.cat([torch.arange(10), torch.arange(14)]).unsqueeze(0),
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=14,
        max_length_k=14,
        use_cache=False,
    )
    with torch.no_grad():
        _step("packed forward", lambda: model(input_ids=ids, **packed).logits)
    parallel = _step(
        "build_parallelize_model",
        lambda: build_parallelize_model(
            model,
            weights_path=path,
            mixed_precision=MixedPrecisionConfig(enable=False),
            enable_gradient_checkpointing=False,
        ),
    )
    _step("forward + backward", lambda: parallel(input_ids=ids, labels=ids, **packed).loss.backward())


if __name__ == "__main__":
    for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29633", RANK="0", WORLD_SIZE="1").items():
        os.environ.setdefault(key, value)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    main(sys.argv[1])
    dist.destroy_process_group()
