"""The VeOmni engine's SP hooks with the REAL veomni 0.1.12 parallel state, collator and gather (world 2, gloo).

Run in the veomni environment of ``probe_qwen3_5_moe.py`` (``/tmp/venv-veomni``), with this repository first on
``PYTHONPATH``; ``tests/workers/engine/veomni/test_sequence_parallel.py`` does. VeOmni's Qwen3.5 cannot run on a
CPU (docs/veomni.md), so the model is a per-token one (an HF Qwen2 with no decoder layer: embedding, norm, LM head):
its SP 2 output must then equal its SP 1 output exactly, which checks VeOmni's padding and slicing and the
engine's gather/unpad (order, length) and, through the backward, the gradient convention. It does not check
VeOmni's Ulysses attention. Prints one JSON line per rank.
"""

import json

import torch
import torch.distributed as dist

from verl.utils.testing.dist import run_on_ranks

# three packed sequences, 13 + 11 + 19 = 43 tokens: odd, so VeOmni pads the stream to 44 (22 per rank)
LENGTHS = (13, 11, 19)


def _rank() -> dict:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from veomni.data.data_collator import SequenceParallelCollator
    from veomni.distributed.parallel_state import get_parallel_state, init_parallel_state
    from veomni.distributed.sequence_parallel import gather_outputs

    from verl.workers.engine.veomni.sequence_parallel import veomni_sequence_parallel

    init_parallel_state(dp_size=1, dp_shard_size=1, ulysses_size=2, dp_mode="fsdp2", device_type="cpu")
    state = get_parallel_state()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=0,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = Qwen2ForCausalLM(config)
    ids = torch.randint(1, 64, (1, sum(LENGTHS)), generator=torch.Generator().manual_seed(1))
    pos = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    fed: list[tuple[int, ...]] = []
    embed = model.get_input_embeddings()
    embed.register_forward_pre_hook(lambda _m, args: fed.append(tuple(args[0].shape)))

    whole = model(input_ids=ids, position_ids=pos, use_cache=False).logits  # SP 1 reference
    whole.pow(2).sum().backward()
    whole_grad = embed.weight.grad.clone()
    model.zero_grad()
    collator = SequenceParallelCollator(seq_classification=True)
    with veomni_sequence_parallel(model, collator=collator, gather_outputs=gather_outputs, group=state.sp_group):
        sharded = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    sharded.pow(2).sum().backward()
    grad = embed.weight.grad.clone()
    dist.all_reduce(grad)  # FSDP2's mean over the dp_shard_sp mesh (here: the 2 SP ranks)
    grad /= dist.get_world_size()
    return {
        "sp_rank": state.sp_rank,
        "fed": fed,
        "out": list(sharded.shape),
        "max_abs_diff": float((sharded - whole).abs().max()),
        "grad_max_abs_diff": float((grad - whole_grad).abs().max()),
    }


if __name__ == "__main__":
    for result in run_on_ranks(_rank, world_size=2):
        print(json.dumps(result))
