"""MoE router replay on 2 gloo ranks: Ulysses SP 2 and FSDP2 data parallelism equal one process.

The tiny Qwen3.5-MoE (HF ``Qwen3_5MoeForCausalLM`` + the project's CPU patches: 4 layers [GDN, GDN, GDN, full
attention], each with a top-2 MoE). The batch (``rollout_batch``, 4 rows of 13 positions, row i with ``i % 3``
prompt pads and ``i % 4`` response pads) packs to T = 13 + 11 + 9 + 10 = 43 tokens: odd, so SP 2 pads the stream
to 44 and the ranks hold [0, 22) and [22, 44); the second sequence [13, 24) straddles the cut. Every rank of the
SP group holds the whole batch and the routing of the whole stream; each must force the experts of the 22 tokens
its decoder runs.

Independent observer: a pre-hook on every ``Qwen3_5MoeExperts`` module reads the ``top_k_index`` the experts run
with on each rank; the parent concatenates the ranks' slices (rank order, padding dropped) and compares them with
the one-process recording, so the slicing is checked at the experts, not from the replay code's bookkeeping.

Tolerances (fp32): log-probs <= 1e-5 (SP changes only the reduction order of the per-head attention sums and the
all-to-all layout); SP gradients averaged over the SP ranks (what FSDP's reduction does) equal the SP 1 gradients
to 1e-4 of each parameter's largest entry (sums over different token splits); FSDP2 world 2 vs one process:
weights after two SGD epochs at lr 1 equal to 1e-6 (observed 3e-8), grad norms to rel 1e-5 (the dp all-reduce
sums two halves of the same token-normalised loss: only the fp32 summation order differs).
"""

import pytest
import torch
import torch.distributed as dist

from tests.workers.conftest import log_probs_of, rollout_batch
from verl.models.tiny import build_tiny_model
from verl.models.transformers.patch_registry import apply_patches
from verl.models.transformers.router_replay import install_router_replay
from verl.utils.testing.dist import run_on_ranks
from verl.workers.core.model_forward import RoutingStep

pytestmark = pytest.mark.dist

RESPONSE_LEN = 7
ROWS = 4


def _moe(seed: int = 0):
    torch.manual_seed(seed)
    model = build_tiny_model("qwen3_5_moe", vocab_size=128).float()
    apply_patches(model, platform="cpu", report=False)
    return model


def _batch(rows: int = ROWS):
    return rollout_batch(batch_size=rows, response_len=RESPONSE_LEN)


class _ExpertsObserver:
    """The (tokens, top-k) expert ids each MoE layer's experts run with, per forward, stacked as (T, L, k)."""

    def __init__(self, model):
        self.calls: list[torch.Tensor] = []
        experts = [m for m in model.modules() if type(m).__name__.endswith("MoeExperts")]
        self.handles = [m.register_forward_pre_hook(self._hook) for m in experts]

    def _hook(self, module, args):
        self.calls.append(args[1].detach().clone())

    def last(self) -> torch.Tensor:
        n = len(self.handles)
        return torch.stack(self.calls[-n:], dim=1)


def _forward(model, batch, group=None, routing=None, remove_padding=True, grad_weights=None):
    """Log-probs (B, R); with ``grad_weights`` also the gradients of sum(w * log-probs) (same w on every rank)."""
    model.zero_grad()
    out = log_probs_of(model, batch, RESPONSE_LEN, remove_padding=remove_padding, group=group, routing=routing)
    if grad_weights is None:
        return out["log_probs"].detach(), None
    (out["log_probs"] * grad_weights).sum().backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).clone() for n, p in model.named_parameters()}
    return out["log_probs"].detach(), grads


def _sp_mean(grads: dict, group) -> dict:
    for name in sorted(grads):  # fixed order: every rank joins every all-reduce
        dist.all_reduce(grads[name], group=group)
        grads[name] /= dist.get_world_size(group)
    return grads


def _sp_replay_rank() -> dict:
    """Per rank: SP 1 (no group) record + replay, SP 2 (the world) replay of the same routing, SP 2 record,
    padded replay, and SP 2 replay of another batch's routing (control)."""
    group = dist.group.WORLD
    model, batch = _moe(), _batch().batch
    router = install_router_replay(model)
    weights = torch.linspace(0.5, 1.5, ROWS * RESPONSE_LEN).view(ROWS, RESPONSE_LEN)
    native, _ = _forward(model, batch)
    record = RoutingStep(router, "record")
    _forward(model, batch, routing=record)
    routing = record.recorded
    sp1_lp, sp1_grads = _forward(model, batch, routing=RoutingStep(router, "replay", routing), grad_weights=weights)

    observer = _ExpertsObserver(model)
    sp2_replay = RoutingStep(router, "replay", routing)
    sp2_lp, sp2_grads = _forward(model, batch, group, sp2_replay, grad_weights=weights)
    sp2_experts = observer.calls[: len(observer.handles)]  # the forward's own calls, before any recompute
    sp2_grads = _sp_mean(sp2_grads, group)
    sp2_record = RoutingStep(router, "record")
    sp2_native, _ = _forward(model, batch, group, sp2_record)
    padded_lp, _ = _forward(model, batch, routing=RoutingStep(router, "replay", routing), remove_padding=False)
    other = routing[torch.tensor([1, 0, 3, 2])]  # rows 0/1 and 2/3 swap their routing
    control, _ = _forward(model, batch, group, RoutingStep(router, "replay", other))
    rel = {n: ((sp2_grads[n] - g).abs().max() / g.abs().max().clamp(min=1e-12)).item() for n, g in sp1_grads.items()}
    return {
        "native": native,
        "routing": routing,
        "sp1": sp1_lp,
        "sp2": sp2_lp,
        "padded": padded_lp,
        "sp2_native": sp2_native,
        "sp2_recorded": sp2_record.recorded,
        "sp2_replay_recorded": sp2_replay.recorded,
        "sp2_experts": torch.stack(sp2_experts, dim=1),
        "control": control,
        "grad_rel": max(rel.values()),
        "router_grad": max(g.abs().max().item() for n, g in sp1_grads.items() if n.endswith("gate.weight")),
        "mask": batch["attention_mask"].bool(),
    }


def test_sp2_with_routing_replay_equals_sp1_packed_and_padded():
    """Invariant (SP 2 = SP 1 = padded, under replay): replaying one routing gives the same log-probs (<= 1e-5)
    and SP-mean gradients (<= 1e-4 of each parameter's largest entry) at SP 2 as at SP 1 and in the padded
    forward; the experts of the two SP ranks run, on the 22 tokens each holds, exactly the recorded ids of those
    tokens (100% of (token, layer) pairs); SP 2 recording returns the whole stream's routing on both ranks, equal to
    SP 1's on every real token. Control: another batch's routing changes the log-probs."""
    ranks = run_on_ranks(_sp_replay_rank, world_size=2, timeout_s=300)
    for r in ranks:
        assert (r["sp2"] - r["sp1"]).abs().max() <= 1e-5
        assert (r["padded"] - r["sp1"]).abs().max() <= 1e-5
        # replaying the own routing = the native forward (same weights)
        assert (r["sp1"] - r["native"]).abs().max() <= 1e-6
        assert r["grad_rel"] <= 1e-4 and r["router_grad"] > 0
        assert torch.equal(r["sp2_recorded"][r["mask"]], r["routing"][r["mask"]])
        assert torch.equal(r["sp2_replay_recorded"][r["mask"]], r["routing"][r["mask"]])
        assert (r["control"] - r["sp2"]).abs().max() > 1e-3
    # the stream order of the packed forward is the row-major order of the real tokens
    stream = ranks[0]["routing"][ranks[0]["mask"]].long()  # (43, L, k)
    assert stream.shape[0] == 43
    slices = [r["sp2_experts"] for r in ranks]
    assert [s.shape[0] for s in slices] == [22, 22]
    assert torch.equal(torch.cat(slices)[:43], stream)


# ------------------------------------------------------------------------- FSDP2 world 2 = one process (R2)
_FP32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}
_LR = 1.0


def _actor_config(mode: str, rows: int, sp: int = 1):
    from verl.workers.config import FSDPActorConfig, RouterReplayConfig

    return FSDPActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=rows,
        ppo_micro_batch_size_per_gpu=2,
        ppo_epochs=2,
        use_torch_compile=False,
        router_replay=RouterReplayConfig(mode=mode),
        ulysses_sequence_parallel_size=sp,
    )


def _r2_step(actor, data) -> dict:
    """R2 as the trainer runs it: compute_log_prob records routed_experts (and the old log-probs), update_policy
    replays them in both epochs."""
    data.meta_info.update(temperature=1.0, micro_batch_size=2)
    out = actor.compute_log_prob(data)
    data.batch["old_log_probs"] = out["log_probs"]
    if "routed_experts" in out:
        data.batch["routed_experts"] = out["routed_experts"]
    metrics = actor.update_policy(data)
    return {"log_probs": out["log_probs"], "routed_experts": out.get("routed_experts"), "metrics": metrics}


def _single_process(mode: str) -> dict:
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    model = _moe()
    actor = DataParallelPPOActor(_actor_config(mode, 8), model, torch.optim.SGD(model.parameters(), lr=_LR))
    step = _r2_step(actor, _batch(8))
    return {**step, "state": {k: v.clone() for k, v in model.state_dict().items()}}


def _fsdp2_rank(layout: str) -> dict:
    """``dp``: FSDP2 over both ranks, each with half the 8 rows; ``sp``: FSDP2 over both ranks as one Ulysses SP 2
    group (dp 1), both with all 8 rows."""
    from torch.distributed.device_mesh import init_device_mesh

    from verl.utils.fsdp_utils import create_device_mesh, get_fsdp_adapter
    from verl.workers.actor.dp_actor import DataParallelPPOActor

    world, rank = dist.get_world_size(), dist.get_rank()
    adapter = get_fsdp_adapter("fsdp2")
    wrapped = adapter.wrap(_moe(), mesh=create_device_mesh(world, -1), dtypes=_FP32, wrap_policy=None)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=_LR)
    if layout == "sp":
        mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "sp"))
        groups = {"dp_group": mesh["dp"].get_group(), "ulysses_group": mesh["sp"].get_group()}
        data, config = _batch(8), _actor_config("R2", 8, sp=world)
    else:
        groups, data, config = {}, _batch(8).chunk(world)[rank], _actor_config("R2", 8 // world)
    step = _r2_step(DataParallelPPOActor(config, wrapped, optimizer, **groups), data)
    return {**step, "state": adapter.full_state_dict(wrapped)}


def _fsdp2_ranks() -> dict:
    return {layout: _fsdp2_rank(layout) for layout in ("dp", "sp")}


def test_fsdp2_world_2_with_r2_equals_one_process():
    """Invariant (FSDP2 world 2 = one process, with R2 on): the old-log-prob pass records the same routing and
    log-probs on every row (<= 1e-6 with dp 2, <= 1e-5 with SP 2), and after two PPO epochs that replay it the
    weights equal (<= 1e-6) and the grad norms agree (rel 1e-5), both with the 8 rows split over 2 dp ranks and
    with Ulysses SP 2 over both ranks. Non-vacuous: without replay the same two epochs end at different weights
    (6.8e-4 away: the second epoch's native routing moved), so the replay is what both layouts reproduce."""
    reference, disabled = _single_process("R2"), _single_process("disabled")
    drift = max((reference["state"][k] - v).abs().max().item() for k, v in disabled["state"].items())
    assert drift > 1e-4, f"replay made no difference ({drift:.2e}): the test could not tell a wrong replay apart"
    ranks = run_on_ranks(_fsdp2_ranks, world_size=2, timeout_s=400)
    dp_log_probs = torch.cat([r["dp"]["log_probs"] for r in ranks])
    dp_routing = torch.cat([r["dp"]["routed_experts"] for r in ranks])
    mask = _batch(8).batch["attention_mask"].bool()
    assert (dp_log_probs - reference["log_probs"]).abs().max() <= 1e-6
    assert torch.equal(dp_routing[mask], reference["routed_experts"][mask])
    for r in ranks:
        assert (r["sp"]["log_probs"] - reference["log_probs"]).abs().max() <= 1e-5
        assert torch.equal(r["sp"]["routed_experts"][mask], reference["routed_experts"][mask])
    for layout in ("dp", "sp"):
        got = ranks[0][layout]
        ref_norms, norms = reference["metrics"]["actor/grad_norm"], got["metrics"]["actor/grad_norm"]
        assert norms == pytest.approx(ref_norms, rel=1e-5), layout
        for name, value in reference["state"].items():
            torch.testing.assert_close(got["state"][name], value, rtol=0, atol=1e-6, msg=f"{layout}: {name}")
