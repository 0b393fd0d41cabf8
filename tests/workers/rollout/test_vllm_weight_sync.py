"""Actor -> vLLM weight sync (verl/workers/sharding_manager/vllm_weight_sync.py) against the fake vLLM Qwen3.5-MoE
engine of tests/utils/vllm/fake_vllm_qwen3_5.py: plain, FSDP1, FSDP2 and FSDP2 with parameter offload.

The real engine (vLLM's CPU build) is synced in test_vllm_engine_sync.py. These keep what it cannot show here: the
trainer side of the stream tensor by tensor (grouping, expert split, names, dtypes), the vllm-ascend MoE layout
(transposed experts, lost loaders), the multimodal wrapper's name mapping, the gather from an FSDP2 actor offloaded on
the simulated Ascend device, and the manager's RNG bookkeeping. The fake records the tensors it receives exactly, so
equality here is against the actor's own state dict."""

import importlib.util
import os
import socket
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl.models.tiny import build_tiny_model
from verl.utils.device import get_device_name, get_nccl_backend
from verl.utils.platform.npu_sim.pytest_plugin import npu_sim  # noqa: F401
from verl.utils.testing.dist import spawn
from verl.workers.sharding_manager.vllm_weight_sync import (
    FSDPVLLMShardingManager,
    align_names_to_engine,
    group_by_layer,
    iter_full_tensors,
    iter_vllm_weights,
    load_weights_into_vllm,
    split_fused_experts,
    sync_actor_weights_to_vllm,
)

# the field report ran transformers 5.4.0: these also run against it (make test-tf-compat)
pytestmark = pytest.mark.tf_compat

FAKE_PATH = Path(__file__).parents[2] / "utils" / "vllm" / "fake_vllm_qwen3_5.py"


def fake_vllm():
    name = "fake_vllm_qwen3_5"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, FAKE_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def tiny(kind: str = "qwen3_5_moe"):
    # moe_intermediate 16: expert slots are not square, so a layout mix-up cannot go unnoticed
    return build_tiny_model(kind, vocab_size=96, seed=0, moe_intermediate_size=16)


def engine_tensors_in_hf_layout(engine) -> dict[str, torch.Tensor]:
    """Un-stack the fake engine's parameters back to HF (fused-expert) names, undoing Ascend's transpose.

    in_proj_qkvz rows = [qkv | z] (sizes 2*key_dim + value_dim, value_dim); in_proj_ba = [b | a]; qkv_proj =
    [q | k | v]; gate_up_proj = [gate | up]; w13 [E, H, 2I] -> [E, 2I, H]; w2 [E, I, H] -> [E, H, I].
    """
    out = {}
    for name, param in engine.named_parameters():
        value = param.data
        if name.endswith("in_proj_qkvz.weight"):
            z_rows = value.shape[0] - engine_key_value_rows(engine)
            qkv, z = value.split([value.shape[0] - z_rows, z_rows])
            out[name.replace("in_proj_qkvz", "in_proj_qkv")], out[name.replace("in_proj_qkvz", "in_proj_z")] = qkv, z
        elif name.endswith("in_proj_ba.weight"):
            b, a = value.chunk(2)
            out[name.replace("in_proj_ba", "in_proj_b")], out[name.replace("in_proj_ba", "in_proj_a")] = b, a
        elif name.endswith("qkv_proj.weight"):
            module = engine.get_submodule(name.rsplit(".", 1)[0])
            for proj, part in zip(("q_proj", "k_proj", "v_proj"), value.split(module.output_sizes), strict=True):
                out[name.replace("qkv_proj", proj)] = part
        elif name.endswith("gate_up_proj.weight"):
            gate, up = value.chunk(2)
            out[name.replace("gate_up_proj", "gate_proj")], out[name.replace("gate_up_proj", "up_proj")] = gate, up
        elif name.endswith("w13_weight") or name.endswith("w2_weight"):
            new = "gate_up_proj" if name.endswith("w13_weight") else "down_proj"
            out[name.rsplit(".", 1)[0] + "." + new] = value.transpose(1, 2)  # the fake engine is Ascend-like
        else:
            out[name] = value
    return out


def engine_key_value_rows(engine) -> int:
    """Rows of in_proj_qkv: 2 * key_dim + value_dim (the fake keeps them in output_sizes[:3])."""
    gdn = next(m for n, m in engine.named_modules() if n.endswith("linear_attn.in_proj_qkvz"))
    return sum(gdn.output_sizes[:3])


def rollout_cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What the sync sends for ``tensor``: matrices in the rollout dtype, vectors in their own (module docstring of
    vllm_weight_sync: engines keep some vectors, e.g. the GDN A_log, in fp32)."""
    return tensor.to(dtype) if tensor.dim() >= 2 else tensor


def assert_engine_holds(engine, hf_state: dict, dtype=torch.float32, prefix_map=()) -> None:
    got = engine_tensors_in_hf_layout(engine)
    expected = {}
    for name, tensor in hf_state.items():
        for old, new in prefix_map:
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        expected[name] = tensor
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        # the engine stores fp32; a bf16 push is exact after the round trip fp32 -> bf16 -> fp32
        assert torch.equal(got[name], rollout_cast(tensor, dtype).float()), name


# ----------------------------------------------------------------------------------------------------------------
# single process
# ----------------------------------------------------------------------------------------------------------------


def test_group_by_layer_is_lazy_and_keeps_blocks_together():
    """Tensors of one block (layers.N / blocks.N) form one group, others are alone, and the input is consumed only
    as far as the group being yielded (+1 lookahead): the stream never holds more than one layer."""
    names = ["model.embed.w", "model.layers.0.a", "model.layers.0.b", "model.layers.1.a", "visual.blocks.0.x", "lm.w"]
    consumed = []

    def stream():
        for n in names:
            consumed.append(n)
            yield n, torch.zeros(1)

    groups = group_by_layer(stream())
    assert list(next(groups)) == ["model.embed.w"] and len(consumed) == 2
    assert list(next(groups)) == ["model.layers.0.a", "model.layers.0.b"] and len(consumed) == 4
    assert [list(g) for g in groups] == [["model.layers.1.a"], ["visual.blocks.0.x"], ["lm.w"]]


def test_per_expert_format_splits_experts_and_casts_floats():
    """The default format yields per-expert names (E=4 experts x 3 projections replace 2 fused tensors per layer),
    matrices cast to the rollout dtype (bf16), vectors (norms, A_log, dt_bias) in the actor's fp32; 'hf' keeps the
    fused tensors; 'checkpoint' (transformers' reverse conversion) splits the same way."""
    model = tiny()
    weights = dict(iter_vllm_weights(model, dtype=torch.bfloat16))
    n_layers, n_experts = 4, 4
    assert len(weights) == len(model.state_dict()) + n_layers * (3 * n_experts - 2)
    gate_up = model.model.layers[2].mlp.experts.gate_up_proj.detach()  # [E, 2I=32, H], gate rows first
    assert torch.equal(weights["model.layers.2.mlp.experts.3.up_proj.weight"], gate_up[3, 16:].bfloat16())
    assert {t.dtype for t in weights.values() if t.dim() >= 2} == {torch.bfloat16}
    assert {t.dtype for t in weights.values() if t.dim() < 2} == {torch.float32}
    assert weights["model.layers.0.linear_attn.A_log"].dtype == torch.float32
    fused = dict(iter_vllm_weights(model, weight_format="hf"))
    assert torch.equal(fused["model.layers.2.mlp.experts.gate_up_proj"], gate_up)
    # transformers 5.4 names the text model model.language_model.* here, 5.24 model.*: both are valid checkpoints
    checkpoint = dict(iter_vllm_weights(model, weight_format="checkpoint"))
    (up_name,) = [n for n in checkpoint if n.endswith("layers.2.mlp.experts.3.up_proj.weight")]
    assert torch.equal(checkpoint[up_name], gate_up[3, 16:]) and len(checkpoint) == len(weights)
    with pytest.raises(ValueError, match="weight_format"):
        next(iter_vllm_weights(model, weight_format="fused"))


def test_split_fused_experts_by_hand():
    """E=2, I=1, H=2: gate_up [[g0; u0], [g1; u1]] -> gate_proj/up_proj rows per expert, down [E, H=2, I=1] -> per
    expert; other tensors keep their place; a pair that is not [E, 2I, H] / [E, H, I] is refused."""
    gate_up = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])
    down = torch.tensor([[[9.0], [10.0]], [[11.0], [12.0]]])
    group = {"l.0.norm": torch.zeros(1), "l.0.mlp.experts.gate_up_proj": gate_up, "l.0.mlp.experts.down_proj": down}
    out = split_fused_experts(group)
    assert list(out) == [
        "l.0.norm",
        "l.0.mlp.experts.0.gate_proj.weight",
        "l.0.mlp.experts.0.up_proj.weight",
        "l.0.mlp.experts.1.gate_proj.weight",
        "l.0.mlp.experts.1.up_proj.weight",
        "l.0.mlp.experts.0.down_proj.weight",
        "l.0.mlp.experts.1.down_proj.weight",
    ]
    assert out["l.0.mlp.experts.1.gate_proj.weight"].tolist() == [[5.0, 6.0]]
    assert out["l.0.mlp.experts.1.up_proj.weight"].tolist() == [[7.0, 8.0]]
    assert out["l.0.mlp.experts.0.down_proj.weight"].tolist() == [[9.0], [10.0]]
    transposed = {**group, "l.0.mlp.experts.gate_up_proj": gate_up.transpose(1, 2).repeat(1, 1, 1)}
    transposed["l.0.mlp.experts.down_proj"] = torch.zeros(2, 1, 2)  # [E, I, H]: not the standard layout
    with pytest.raises(ValueError, match="weight_format='checkpoint'"):
        split_fused_experts(transposed)


@pytest.mark.parametrize("kind", ["qwen3_5_moe", "qwen3_5_moe_vl"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sync_into_ascend_like_engine(kind, dtype):
    """A full sync into the vllm-ascend-like engine (expert params re-created transposed, without loader): every
    engine parameter equals the actor's tensor in the rollout dtype; text and multimodal wrapper."""
    model = tiny(kind)
    vllm = fake_vllm()
    engine = vllm.build_fake_vllm_model(model.config, "ascend")
    report = sync_actor_weights_to_vllm(model, engine, dtype=dtype)
    assert len(report.repair.reattached) == 8
    prefix_map = vllm._HF_TO_VLLM_PREFIXES if kind.endswith("_vl") else ()
    assert_engine_holds(engine, model.state_dict(), dtype, prefix_map)
    assert report.num_tensors == len(list(iter_vllm_weights(model)))
    assert report.num_bytes == sum(rollout_cast(t, dtype).nbytes for _, t in iter_vllm_weights(model))


def test_language_model_prefix_follows_the_engine():
    """The trainer may emit a VLM's text weights as model.language_model.* (multimodal checkpoint names; always so
    after transformers 5.4's reverse conversion) or model.* (text-only class): a text-only engine gets model.* and
    no vision weights, a multimodal wrapper gets model.language_model.*; other names pass unchanged."""
    vllm = fake_vllm()
    text_engine = vllm.build_fake_vllm_model(tiny().config, "cuda")
    vl_engine = vllm.build_fake_vllm_model(tiny("qwen3_5_moe_vl").config, "cuda")
    names = ["model.language_model.norm.weight", "model.norm.weight", "model.visual.pos_embed.weight", "lm_head.weight"]
    weights = [(n, torch.zeros(1)) for n in names]
    assert [n for n, _ in align_names_to_engine(weights, text_engine)] == [
        "model.norm.weight",
        "model.norm.weight",
        "lm_head.weight",
    ]
    assert [n for n, _ in align_names_to_engine(weights, vl_engine)] == [
        "model.language_model.norm.weight",
        "model.language_model.norm.weight",
        "model.visual.pos_embed.weight",
        "lm_head.weight",
    ]


def test_multimodal_checkpoint_names_into_a_text_engine():
    """A text model trained from a multimodal checkpoint streams model.language_model.* names; the text-only engine
    still receives every weight exactly."""
    model = tiny()
    engine = fake_vllm().build_fake_vllm_model(model.config, "ascend")
    vl_prefix = "model.language_model."
    renamed = [
        (vl_prefix + n[len("model.") :] if n.startswith("model.") and not n.startswith(vl_prefix) else n, t)
        for n, t in iter_vllm_weights(model)
    ]
    assert all(n.startswith((vl_prefix, "lm_head.")) for n, _ in renamed)
    load_weights_into_vllm(engine, renamed)
    assert_engine_holds(engine, model.state_dict())


def test_a_second_sync_overwrites_the_first():
    """After a training step the next sync replaces every value (repair already done, still exact)."""
    vllm = fake_vllm()
    model = tiny()
    engine = vllm.build_fake_vllm_model(model.config, "ascend")
    sync_actor_weights_to_vllm(model, engine)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    report = sync_actor_weights_to_vllm(model, engine)
    assert not report.repair.changed
    assert_engine_holds(engine, model.state_dict())


def test_unknown_name_surfaces_from_the_engine():
    """Names the engine does not know are vLLM's error to raise (KeyError from its params dict), not swallowed."""
    engine = fake_vllm().build_fake_vllm_model(tiny().config, "cuda")
    with pytest.raises(KeyError):
        load_weights_into_vllm(engine, [("model.layers.0.not_a_param.weight", torch.zeros(1))])


class _FakeRollout:
    """The slice of vLLMRollout the sharding manager uses; records the call order."""

    def __init__(self, engine):
        self.engine = engine
        self.calls = []
        self.config = type("Cfg", (), {"dtype": "bfloat16"})()

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))

    def sleep(self):
        self.calls.append(("sleep",))

    def load_weights(self, weights):
        self.calls.append(("load_weights",))
        return load_weights_into_vllm(self.engine, weights)


def test_sharding_manager_order_and_rng():
    """Enter: wake weights -> load -> wake KV cache; exit: sleep. The generation RNG stream continues across
    contexts and is independent of training draws, and the training RNG is restored on exit."""
    model = tiny()
    rollout = _FakeRollout(fake_vllm().build_fake_vllm_model(model.config, "ascend"))
    manager = FSDPVLLMShardingManager(model, rollout, dp_rank=1)
    torch.manual_seed(7)
    with manager:
        first = torch.rand(3)
    train_draw = torch.rand(3)
    with manager:
        second = torch.rand(3)
    assert rollout.calls == [("wake_up", ("weights",)), ("load_weights",), ("wake_up", ("kv_cache",)), ("sleep",)] * 2
    torch.manual_seed(7)
    assert torch.equal(torch.rand(3), train_draw)  # training stream untouched by generation draws
    torch.manual_seed(1001)  # seed 1000 + dp_rank 1
    assert torch.equal(torch.rand(3), first) and torch.equal(torch.rand(3), second)
    assert_engine_holds(rollout.engine, model.state_dict(), torch.bfloat16)


@pytest.mark.usefixtures("npu_sim")
def test_offloaded_fsdp2_actor_on_simulated_npu():
    """FSDP2 with CPU parameter offload on the simulated Ascend (1 rank, gloo for cpu tensors, the simulated collective backend for npu ones): the manager gathers
    on the rank's npu by default, the npu-resident engine receives exactly the model's bf16 weights, and the
    actor's parameters stay offloaded on the CPU (no full copy of the model is moved to the device)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    with tempfile.NamedTemporaryFile() as init_file:
        backend = f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"  # the simulated hccl for npu tensors
        dist.init_process_group(backend, init_method=f"file://{init_file.name}", rank=0, world_size=1)
        try:
            model = tiny()
            reference = {k: v.clone() for k, v in model.state_dict().items()}
            policy = CPUOffloadPolicy(pin_memory=True)
            for layer in model.model.layers:
                fully_shard(layer, mesh=init_device_mesh("npu", (1,)), offload_policy=policy)
            fully_shard(model, mesh=init_device_mesh("npu", (1,)), offload_policy=policy)
            rollout = _FakeRollout(fake_vllm().build_fake_vllm_model(model.config, "ascend").to("npu"))
            with FSDPVLLMShardingManager(model, rollout) as manager:
                assert manager.device.type == "npu"
            assert {p.device.type for p in model.parameters()} == {"cpu"}
            assert {p.device.type for p in rollout.engine.parameters()} == {"npu"}
            got = {k: v.cpu() for k, v in engine_tensors_in_hf_layout(rollout.engine).items()}
            for name, tensor in reference.items():
                assert torch.equal(got[name], rollout_cast(tensor, torch.bfloat16).float()), name
        finally:
            dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------------------
# FSDP1 / FSDP2, world size 2 (gloo)
# ----------------------------------------------------------------------------------------------------------------

_FP32 = {"param_dtype": torch.float32, "reduce_dtype": torch.float32, "buffer_dtype": torch.float32}
_SETUPS = (("fsdp", False), ("fsdp2", False), ("fsdp2", True))  # (strategy, parameter offload)


def _dist_worker(rank: int, port: int, out: dict) -> None:
    from verl.utils import fsdp_utils

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mesh = fsdp_utils.create_device_mesh(2, -1)
        for strategy, offload in _SETUPS:  # one spawn for all setups: process start-up dominates the cost
            adapter = fsdp_utils.get_fsdp_adapter(strategy)
            wrapped = adapter.wrap(tiny(), mesh=mesh, dtypes=_FP32, wrap_policy=None, offload_params=offload)
            names = [name for name, _ in iter_full_tensors(wrapped)]
            engine = fake_vllm().build_fake_vllm_model(tiny().config, "ascend")
            sync_actor_weights_to_vllm(wrapped, engine, dtype=torch.bfloat16)
            engine_state = {k: v.clone() for k, v in engine_tensors_in_hf_layout(engine).items()}
            out[(rank, strategy, offload)] = {"names": names, "engine": engine_state}
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.dist
def test_fsdp_sync_equals_unsharded_model():
    """FSDP1, FSDP2 and FSDP2 with CPU parameter offload on 2 gloo ranks: the gathered names are the plain model's
    state-dict names, and every rank's engine receives exactly the single-process model's weights (bf16)."""
    out = mp.Manager().dict()
    spawn(_dist_worker, args=(_free_port(), out), nprocs=2)
    reference = tiny().state_dict()
    for strategy, offload in _SETUPS:
        for rank in (0, 1):
            result = out[(rank, strategy, offload)]
            assert result["names"] == list(reference), (strategy, offload)
            for name, tensor in reference.items():
                expected = rollout_cast(tensor, torch.bfloat16).float()
                assert torch.equal(result["engine"][name], expected), (strategy, offload, rank, name)
