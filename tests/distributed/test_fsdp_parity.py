"""FSDP1 and FSDP2 at world size 2 equal one process: 3 PPO actor updates of the tiny Qwen3.5-MoE through the legacy
worker (``fsdp_workers.ActorRolloutRefWorker``, role ``actor``) under every ``fsdp_config`` variant, against
``DataParallelPPOActor`` on the unwrapped model in the test process (field-report item 9: one strategy key).

ONE spawn of 2 gloo ranks runs every distributed variant in sequence (process start dominates the cost).
The reference and every fp32 variant run on one thread per rank, where the CPU kernels are deterministic; FSDP only
changes the order of the gradient reduction (sum of two half-batch gradients, then / 2), so fp32 agreement is
~1e-7 relative and 1e-5 is a safe bound that still catches a wrong loss scale (factor 2), a missed reduction or
an update skipped on one rank (all >= 1e-3).
"""

import pytest
import torch

from verl.protocol import DataProto
from verl.utils.testing.dist import run_on_ranks

STEPS = 3
_FP32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
_BF16 = {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}

# name -> (strategy, fsdp_config overrides); every key of fsdp_config that changes how the model is sharded
VARIANTS = {
    "fsdp": ("fsdp", {}),
    "fsdp2": ("fsdp2", {}),
    "fsdp2_offload_policy": ("fsdp2", {"offload_policy": True}),
    "fsdp2_manual_offload": ("fsdp2", {"param_offload": True, "optimizer_offload": True}),
    "fsdp_manual_offload": ("fsdp", {"param_offload": True, "optimizer_offload": True}),
    "fsdp2_hsdp_replicate": ("fsdp2", {"fsdp_size": 1}),
    "fsdp_hsdp_replicate": ("fsdp", {"fsdp_size": 1}),
    "fsdp2_zero2_prefetch": ("fsdp2", {"reshard_after_forward": False, "forward_prefetch": True}),
    "fsdp_zero2_prefetch": ("fsdp", {"reshard_after_forward": False, "forward_prefetch": True}),
    "fsdp2_bf16_compute": ("fsdp2", {"mixed_precision": _BF16}),
    "fsdp2_bf16_weights": ("fsdp2", {"model_dtype": "bf16", "mixed_precision": _BF16}),
}


def _run_variants(configs: dict, batches: list[DataProto]) -> dict:
    """On each rank: for every variant, a fresh actor worker, 3 update_actor calls on this rank's 4 rows; returns the
    per-step (pg_loss, grad_norm) and the wrapper's layout (what FSDP actually does) per variant."""
    import torch.distributed as dist

    from verl.utils.fsdp_utils import adapter_for
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for name, config in configs.items():
        worker = ActorRolloutRefWorker(config, role="actor")
        worker.init_model()
        steps = []
        for batch in batches:
            metrics = worker.update_actor(batch.chunk(world)[rank]).meta_info["metrics"]
            steps.append((metrics["actor/pg_loss"][0], metrics["actor/grad_norm"][0]))
        module = worker.actor_module_fsdp
        results[name] = {"steps": steps, "layout": adapter_for(module).describe(module)}
    return results


@pytest.fixture(scope="module")
def parity_runs(ppo_setup):
    """(reference steps, {variant: per-step (loss, grad norm) over both ranks}, per-rank raw results)."""
    batches = ppo_setup.batches(STEPS)
    configs = {name: ppo_setup.worker_config(strategy, keys) for name, (strategy, keys) in VARIANTS.items()}
    per_rank = run_on_ranks(_run_variants, 2, args=(configs, batches), timeout_s=600)
    _, _, actor = ppo_setup.reference_actor()
    reference = [ppo_setup.update(actor, batch) for batch in batches]
    runs = {name: ppo_setup.mean_over_ranks([r[name]["steps"] for r in per_rank]) for name in VARIANTS}
    return reference, runs, per_rank


FP32_VARIANTS = [name for name in VARIANTS if "bf16" not in name]


@pytest.mark.dist
@pytest.mark.parametrize("name", FP32_VARIANTS)
def test_fp32_variant_matches_single_process(parity_runs, name):
    """Invariant: 3 AdamW PPO steps (KL loss, grad clip) of the tiny Qwen3.5-MoE on 2 ranks x 4 rows under the
    variant give, at every step, the single-process pg_loss and grad norm on 8 rows within 1e-5 relative (steps 2
    and 3 see the weights after the distributed updates, so the updates match too)."""
    reference, runs, _ = parity_runs
    assert reference[0][1] > 1e-3  # a real gradient flows
    for step, ((loss, norm), (ref_loss, ref_norm)) in enumerate(zip(runs[name], reference), start=1):
        assert loss == pytest.approx(ref_loss, rel=1e-5), f"step {step} pg_loss"
        assert norm == pytest.approx(ref_norm, rel=1e-5), f"step {step} grad_norm"


# bf16 unit roundoff: 8 significant bits, u = 2**-8 = 3.9e-3 relative per rounding.
BF16_U = 2.0**-8


@pytest.mark.dist
@pytest.mark.parametrize("name", ["fsdp2_bf16_compute", "fsdp2_bf16_weights"])
def test_bf16_mixed_precision_runs_close_to_fp32(parity_runs, name):
    """Invariant (mixed_precision bf16 params / fp32 reduce; with model_dtype=bf16 also bf16 master weights): the 3
    steps run and stay close to fp32. Each matmul rounds its inputs to bf16 once (relative error <= u = 2^-8); the
    pg_loss is a mean over ~60 tokens whose rounding errors do not add up coherently, so it stays within u of fp32
    (observed <= 5e-4); the grad norm, a 2-norm over bf16-rounded gradients after two bf16 weight updates, within
    5u (observed <= 5.3e-3). Step 1 must differ from fp32 by more than the 1e-6 fp32 noise: bf16 compute engaged."""
    reference, runs, _ = parity_runs
    for step, ((loss, norm), (ref_loss, ref_norm)) in enumerate(zip(runs[name], reference), start=1):
        assert loss == pytest.approx(ref_loss, rel=BF16_U), f"step {step} pg_loss"
        assert norm == pytest.approx(ref_norm, rel=5 * BF16_U), f"step {step} grad_norm"
    assert abs(runs[name][0][0] / reference[0][0] - 1) > 1e-6


def _expected_layout(name: str) -> dict:
    strategy, keys = VARIANTS[name]
    mp = keys.get("mixed_precision", _FP32)
    as_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}
    expected = {
        "strategy": strategy,
        # fsdp_size=1 on 2 ranks: 2 replicas of a 1-rank shard group (pure replication); default: 1 x 2 shards
        "replicas": 2 if keys.get("fsdp_size") == 1 else 1,
        "shard_size": 1 if keys.get("fsdp_size") == 1 else 2,
        "storage_dtype": as_dtype[keys.get("model_dtype", "fp32")],
        "param_dtype": as_dtype[mp["param_dtype"]],
        "reduce_dtype": as_dtype[mp["reduce_dtype"]],
        # manual param_offload moves storage between phases; only offload_policy makes FSDP2 own CPU placement
        "cpu_offload": keys.get("offload_policy", False),
        "reshard_after_forward": keys.get("reshard_after_forward", True),
        "forward_prefetch": keys.get("forward_prefetch", False),
    }
    if strategy == "fsdp" and keys.get("fsdp_size") == 1:
        expected["reshard_after_forward"] = False  # NO_SHARD: nothing is ever resharded
    return expected


@pytest.mark.dist
@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_fsdp_config_key_reaches_the_wrapper(parity_runs, name):
    """Invariant: each fsdp_config key is honoured, read back from the FSDP wrapper itself on every rank (not from
    the config): strategy, HSDP replicas x shard size (fsdp_size), model_dtype (storage dtype), mixed_precision
    (compute / reduce dtype), offload_policy (FSDP2 CPUOffloadPolicy), reshard_after_forward, forward_prefetch."""
    _, _, per_rank = parity_runs
    expected = _expected_layout(name)
    for rank_result in per_rank:
        layout = rank_result[name]["layout"]
        actual = {key: getattr(layout, key) for key in expected}
        assert actual == expected
        # 4 decoder layers + root (FSDP1); FSDP2 also shards the untied embedding and LM head on their own
        assert layout.num_units == (5 if layout.strategy == "fsdp" else 7)
