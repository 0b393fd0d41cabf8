"""vLLMRollout without vLLM: config -> engine/sampling kwargs, engine outputs -> rollout batch (hand-worked), and the
class itself driven through a fake ``vllm`` module (``LLM``/``SamplingParams``) whose engine model is the fake vLLM
Qwen3.5-MoE of tests/utils/vllm, synced from a tiny HF model by FSDPVLLMShardingManager.

The real engine runs in tests/workers/rollout/test_vllm_rollout_engine.py and test_vllm_engine_sync.py (vLLM's CPU
build). What stays here is what that build cannot show on this machine: the sleep/wake sequence (the CPU platform
has no sleep mode), the vllm-ascend checks on an NPU device, a tensor-parallel engine across two trainer ranks, and the
pure config -> kwargs and outputs -> batch functions."""

import importlib.machinery
import importlib.util
import os
import socket
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl.base_config import ConfigError
from verl.models.tiny import build_tiny_model
from verl.protocol import DataProto
from verl.utils.testing.dist import spawn
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.config.rollout import MultiTurnConfig, SamplingConfig
from verl.workers.rollout import get_rollout_class
from verl.workers.rollout.vllm_rollout import vllm_rollout as rollout_module
from verl.workers.rollout.vllm_rollout.outputs import (
    assemble_rollout_batch,
    extend_position_ids,
    prompt_token_ids,
    unpack_request_outputs,
)
from verl.workers.rollout.vllm_rollout.params import engine_kwargs, sampling_kwargs
from verl.workers.sharding_manager.vllm_weight_sync import FSDPVLLMShardingManager

FAKE_PATH = Path(__file__).parents[2] / "utils" / "vllm" / "fake_vllm_qwen3_5.py"
EOS, PAD = 2, 0


def rollout_config(**overrides) -> RolloutConfig:
    base = dict(name="vllm", prompt_length=4, response_length=5, tensor_model_parallel_size=1)
    return RolloutConfig(**{**base, **overrides})


# ----------------------------------------------------------------------------------------------------------------
# config -> kwargs
# ----------------------------------------------------------------------------------------------------------------


def test_sampling_kwargs_training_validation_greedy():
    """Training uses rollout.temperature/top_k/top_p; validate=True uses val_kwargs (greedy by default); do_sample
    False is greedy; n is 1 (the trainer repeats rows); EOS ids stop generation unless ignore_eos; logprobs=0
    only with calculate_log_probs."""
    cfg = rollout_config(temperature=0.7, top_k=20, top_p=0.9, calculate_log_probs=True)
    train = sampling_kwargs(cfg, {"eos_token_id": [EOS, 7], "do_sample": True})
    assert train == dict(
        n=1,
        max_tokens=5,
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        ignore_eos=False,
        detokenize=False,
        logprobs=0,
        stop_token_ids=[EOS, 7],
    )
    greedy_val = sampling_kwargs(cfg, {"eos_token_id": EOS, "do_sample": True, "validate": True})
    assert (greedy_val["temperature"], greedy_val["top_k"], greedy_val["top_p"]) == (0.0, -1, 1.0)
    val = SamplingConfig(do_sample=True, temperature=0.5, top_p=0.8, top_k=3)
    cfg = rollout_config(val_kwargs=val, ignore_eos=True)
    sampled_val = sampling_kwargs(cfg, {"eos_token_id": EOS, "do_sample": True, "validate": True})
    assert (sampled_val["temperature"], sampled_val["top_k"], sampled_val["top_p"]) == (0.5, 3, 0.8)
    assert "stop_token_ids" not in sampled_val and sampled_val["logprobs"] is None and sampled_val["ignore_eos"]
    assert sampling_kwargs(cfg, {"eos_token_id": EOS, "do_sample": False})["temperature"] == 0.0
    with pytest.raises(ValueError, match="eos_token_id"):
        sampling_kwargs(rollout_config(), {"do_sample": True})


def test_engine_kwargs_from_rollout_config():
    """Every rollout key reaches vllm.LLM under vLLM's name; max_model_len defaults to prompt + response length;
    'dummy*' load formats map to 'dummy', loaded through verl's recording loader (the configured format travels in
    model_loader_extra_config); free_cache_engine enables sleep mode where the platform has one; a distributed
    trainer uses the external launcher; engine_kwargs.vllm wins over everything."""
    cfg = rollout_config(
        tensor_model_parallel_size=2,
        gpu_memory_utilization=0.6,
        max_num_batched_tokens=64,
        enforce_eager=True,
        load_format="dummy_dtensor",
        dtype="float16",
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        cudagraph_capture_sizes=[1, 2],
        calculate_log_probs=True,
        engine_kwargs={"vllm": {"swap_space": 0, "seed": 5}},
    )
    kwargs = engine_kwargs(cfg, "/m", trust_remote_code=True, distributed=True, tokenizer_path="/tok")
    assert kwargs == dict(
        model="/m",
        tokenizer="/tok",
        skip_tokenizer_init=True,
        trust_remote_code=True,
        tensor_parallel_size=2,
        dtype="float16",
        enforce_eager=True,
        gpu_memory_utilization=0.6,
        max_num_batched_tokens=64,
        max_model_len=9,
        max_num_seqs=1024,
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        load_format="verl_canonical",
        model_loader_extra_config={"verl_inner_load_format": "dummy"},
        disable_log_stats=True,
        enable_sleep_mode=True,
        scheduling_policy="fcfs",
        seed=5,
        logprobs_mode="processed_logprobs",
        compilation_config={"cudagraph_capture_sizes": [1, 2]},
        distributed_executor_backend="external_launcher",
        swap_space=0,
    )
    single = engine_kwargs(rollout_config(), "/m", trust_remote_code=False, distributed=False)
    assert "distributed_executor_backend" not in single and "logprobs_mode" not in single
    assert single["tokenizer"] == "/m"  # no tokenizer_path: the model directory
    no_sleep = engine_kwargs(rollout_config(), "/m", trust_remote_code=False, distributed=False, sleep_mode=False)
    assert no_sleep["enable_sleep_mode"] is False  # a platform without sleep mode (vLLM's CPU build)
    user_format = rollout_config(engine_kwargs={"vllm": {"load_format": "safetensors"}})
    kwargs = engine_kwargs(user_format, "/m", trust_remote_code=False, distributed=False)
    assert (kwargs["load_format"], kwargs["model_loader_extra_config"]) == (
        "verl_canonical",
        {"verl_inner_load_format": "safetensors"},
    )


@pytest.mark.parametrize(
    "overrides,key",
    [
        (dict(max_model_len=8), "actor_rollout_ref.rollout.max_model_len"),  # 8 < 4 + 5
        (dict(enable_chunked_prefill=False, max_num_batched_tokens=8), "actor_rollout_ref.rollout.max_num_batched"),
        (dict(pipeline_model_parallel_size=2), "actor_rollout_ref.rollout.pipeline_model_parallel_size"),
    ],
)
def test_engine_kwargs_reject_inconsistent_lengths(overrides, key):
    """Settings vLLM would reject later (or silently truncate) fail early, naming the full key."""
    with pytest.raises(ConfigError, match=key):
        engine_kwargs(rollout_config(**overrides), "/m", trust_remote_code=False, distributed=False)


def test_sleep_level_is_a_platform_attribute():
    """Ascend's vllm-ascend only implements sleep level 1; CUDA drops the weights too (level 2)."""
    from verl.utils.platform.cuda import CudaPlatform
    from verl.utils.platform.npu import NpuPlatform

    assert (NpuPlatform.vllm_sleep_level, CudaPlatform.vllm_sleep_level) == (1, 2)


# ----------------------------------------------------------------------------------------------------------------
# engine outputs -> batch
# ----------------------------------------------------------------------------------------------------------------


def test_prompt_ids_follow_the_mask_not_the_pad_id():
    """A real token equal to the pad id (EOS == pad in many tokenizers) survives; left padding does not."""
    ids = torch.tensor([[0, 0, 5, 0], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert prompt_token_ids(ids, mask) == [[5, 0], [3, 4, 5, 6]]


def test_assemble_rollout_batch_by_hand():
    """B=2, P=3, R=4, EOS=2, pad=0.
    row 0: prompt [pad, 11, 12] (mask 0 1 1, positions 0 0 1); generated [21, 2] (stopped at EOS)
      -> responses [21, 2, 0, 0], response mask [1, 1, 0, 0], positions 2 3 4 5 after the prompt's last (1)
    row 1: prompt [10, 11, 12] (positions 0 1 2); generated [31, 32, 33, 34, 35] (cut at R=4)
      -> responses [31, 32, 33, 34], mask [1, 1, 1, 1], positions 3 4 5 6
    log-probs are copied where the mask is 1 and 0 elsewhere."""
    input_ids = torch.tensor([[PAD, 11, 12], [10, 11, 12]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    positions = torch.tensor([[0, 0, 1], [0, 1, 2]])
    out = assemble_rollout_batch(
        input_ids,
        mask,
        positions,
        [[21, EOS], [31, 32, 33, 34, 35]],
        response_length=4,
        pad_token_id=PAD,
        eos_token_id=[EOS],
        log_probs=[[-0.5, -0.25], [-1.0, -2.0, -3.0, -4.0, -5.0]],
    )
    assert torch.equal(out["prompts"], input_ids)
    assert torch.equal(out["responses"], torch.tensor([[21, EOS, PAD, PAD], [31, 32, 33, 34]]))
    assert torch.equal(out["input_ids"], torch.tensor([[PAD, 11, 12, 21, EOS, PAD, PAD], [10, 11, 12, 31, 32, 33, 34]]))
    assert torch.equal(out["attention_mask"], torch.tensor([[0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]]))
    assert torch.equal(out["position_ids"], torch.tensor([[0, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6]]))
    expected_lp = torch.tensor([[-0.5, -0.25, 0.0, 0.0], [-1.0, -2.0, -3.0, -4.0]])
    assert torch.equal(out["rollout_log_probs"], expected_lp) and out["rollout_log_probs"].dtype == torch.float32


def test_tokens_after_an_eos_are_masked_and_padded():
    """With ignore_eos an engine may continue past EOS ([5, EOS, 6]); like the HF rollout, everything after the
    first EOS is pad and masked: responses [5, EOS, 0], mask [1, 1, 0]."""
    out = assemble_rollout_batch(
        torch.tensor([[1]]),
        torch.tensor([[1]]),
        torch.tensor([[0]]),
        [[5, EOS, 6]],
        response_length=3,
        pad_token_id=PAD,
        eos_token_id=[EOS],
    )
    assert out["responses"].tolist() == [[5, EOS, PAD]] and out["attention_mask"].tolist() == [[1, 1, 1, 0]]
    assert "rollout_log_probs" not in out


def test_mrope_positions_extend_every_row():
    """(B=1, C=3, P=2) M-RoPE ids [[0,1],[0,4],[0,4]] -> each row continues from its last value: +1, +2."""
    pos = torch.tensor([[[0, 1], [0, 4], [0, 4]]])
    assert extend_position_ids(pos, 2).tolist() == [[[0, 1, 2, 3], [0, 4, 5, 6], [0, 4, 5, 6]]]


def _request_output(token_ids, log_probs=None):
    steps = None
    if log_probs is not None:  # vLLM: one {token_id: Logprob} dict per generated token (+ top candidates)
        steps = [
            {t: types.SimpleNamespace(logprob=lp), t + 1: types.SimpleNamespace(logprob=-9.0)}
            for t, lp in zip(token_ids, log_probs)
        ]
    completion = types.SimpleNamespace(token_ids=token_ids, logprobs=steps)
    return types.SimpleNamespace(outputs=[completion])


def test_unpack_request_outputs_picks_the_sampled_tokens_log_prob():
    """The sampled token's entry is taken from each step's candidate dict (not the other candidates)."""
    ids, lps = unpack_request_outputs([_request_output([4, 5], [-0.1, -0.2])], want_log_probs=True)
    assert ids == [[4, 5]] and lps == [[-0.1, -0.2]]
    assert unpack_request_outputs([_request_output([4])], want_log_probs=False) == ([[4]], None)
    with pytest.raises(RuntimeError, match="no log-probs"):
        unpack_request_outputs([_request_output([4])], want_log_probs=True)
    with pytest.raises(RuntimeError, match="2 responses for 1 prompts"):
        assemble_rollout_batch(
            torch.ones(1, 1, dtype=torch.long),
            torch.ones(1, 1),
            torch.zeros(1, 1),
            [[1], [2]],
            response_length=2,
            pad_token_id=PAD,
            eos_token_id=EOS,
        )


# ----------------------------------------------------------------------------------------------------------------
# the class, with a fake `vllm` module
# ----------------------------------------------------------------------------------------------------------------


def _fake_engine_module():
    name = "fake_vllm_qwen3_5"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, FAKE_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class FakeSamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeLLM:
    """vllm.LLM stand-in: the engine model is the fake vLLM Qwen3.5-MoE (Ascend-like MoE method), reachable at
    vLLM's in-process path; generation refuses dummy (NaN) weights and emits prompt[-1]+1, +2, ... up to
    max_tokens, stopping at (and including) a stop id; sampled log-prob of step j is -(j+1)/10."""

    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls = []
        self.requests = []
        self.model = _fake_engine_module().build_fake_vllm_model(FakeLLM.hf_config, "ascend")
        runner = types.SimpleNamespace(model=self.model)
        worker = types.SimpleNamespace(worker=types.SimpleNamespace(model_runner=runner))
        self.llm_engine = types.SimpleNamespace(model_executor=types.SimpleNamespace(driver_worker=worker))
        FakeLLM.instances.append(self)

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, requests, sampling_params, use_tqdm):
        if any(torch.isnan(p).any() for p in self.model.parameters()):
            raise RuntimeError("generating with dummy weights")
        self.calls.append(("generate", sampling_params.kwargs))
        self.requests.append(requests)
        kw = sampling_params.kwargs
        outs = []
        for request in requests:
            tokens = []
            for j in range(kw["max_tokens"]):
                tokens.append(request["prompt_token_ids"][-1] + 1 + j)
                if tokens[-1] in kw.get("stop_token_ids", []):
                    break
            log_probs = [-(j + 1) / 10 for j in range(len(tokens))] if kw["logprobs"] == 0 else None
            outs.append(_request_output(tokens, log_probs))
        return outs


class _FakeBaseModelLoader:
    def __init__(self, load_config):
        self.load_config = load_config


def _fake_vllm_modules(sleep_mode: bool = True) -> dict[str, types.ModuleType]:
    """``vllm`` plus the two submodules vLLMRollout touches before building the engine: the platform (sleep mode)
    and the model-loader registry (verl's recording loader; FakeLLM never loads, so its engine has no recorded
    layout and syncs through the loader-repair path)."""
    module = types.ModuleType("vllm")
    module.__spec__ = importlib.machinery.ModuleSpec("vllm", None)  # find_spec("vllm") sees it as installed
    module.LLM, module.SamplingParams = FakeLLM, FakeSamplingParams
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_sleep_mode_available=lambda: sleep_mode)
    loaders = types.ModuleType("vllm.model_executor.model_loader")
    loaders.register_model_loader = lambda name: lambda cls: cls
    loaders.get_model_loader = lambda config: None
    base_loader = types.ModuleType("vllm.model_executor.model_loader.base_loader")
    base_loader.BaseModelLoader = _FakeBaseModelLoader
    return {
        "vllm": module,
        "vllm.platforms": platforms,
        "vllm.model_executor": types.ModuleType("vllm.model_executor"),
        "vllm.model_executor.model_loader": loaders,
        "vllm.model_executor.model_loader.base_loader": base_loader,
    }


def _fake_vllm_module() -> types.ModuleType:
    modules = _fake_vllm_modules()
    sys.modules.update(modules)
    return modules["vllm"]


@pytest.fixture
def fake_vllm_package(monkeypatch):
    """Install the fake `vllm` modules for one test."""
    modules = _fake_vllm_modules()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    FakeLLM.instances = []
    FakeLLM.hf_config = None
    return modules["vllm"]


def _prompts(meta=None) -> DataProto:
    """2 left-padded prompts, P=4: [pad, pad, 3, 4] and [5, 6, 7, 8]; row 0's generation hits EOS... via stop id 6."""
    ids = torch.tensor([[PAD, PAD, 3, 4], [5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    pos = torch.tensor([[0, 0, 0, 1], [0, 1, 2, 3]])
    meta_info = {"eos_token_id": 6, "pad_token_id": PAD, "do_sample": True, "validate": False, **(meta or {})}
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos}, meta_info=meta_info)


def test_rollout_class_is_registered_lazily(fake_vllm_package):
    """rollout.name=vllm resolves to this class through the workers' registry."""
    assert get_rollout_class("vllm", "sync") is rollout_module.vLLMRollout


def test_hybrid_step_sync_then_generate(fake_vllm_package, tmp_path):
    """One hybrid-engine step on the fake engine: the rollout starts asleep (sleep level 2 on a non-NPU device);
    generating before a sync is refused; inside the sharding manager the weights are woken, synced (exactly, via
    the MoE repair), the prefix cache reset, the KV cache woken; the batch matches the hand-worked values; on exit
    the engine sleeps again.
    Row 0 prompt [3, 4] -> generated 5, 6 (stop id 6 = EOS), padded to R=5; row 1 prompt ends 8 -> 9..13."""
    hf_model = build_tiny_model("qwen3_5_moe", vocab_size=96, moe_intermediate_size=16)
    FakeLLM.hf_config = hf_model.config
    cfg = rollout_config(calculate_log_probs=True)
    rollout = rollout_module.vLLMRollout(cfg, HFModelConfig(path=str(tmp_path)))
    llm = FakeLLM.instances[0]
    assert llm.kwargs["model"] == str(tmp_path) and llm.kwargs["enable_sleep_mode"] is True
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert llm.calls == [("sleep", 2)]
    with pytest.raises(RuntimeError, match="asleep"):
        rollout.generate_sequences(_prompts())

    with FSDPVLLMShardingManager(hf_model, rollout) as manager:
        out = rollout.generate_sequences(_prompts())
    assert manager.last_report.repair.reattached  # the Ascend-like engine (no recorded layout) needed the repair
    expected_calls = [("wake_up", ("weights",)), ("reset_prefix_cache",), ("wake_up", ("kv_cache",))]
    assert llm.calls[1:4] == expected_calls and llm.calls[-1] == ("sleep", 2)
    assert llm.requests[0] == [{"prompt_token_ids": [3, 4]}, {"prompt_token_ids": [5, 6, 7, 8]}]
    assert torch.equal(out.batch["responses"], torch.tensor([[5, 6, PAD, PAD, PAD], [9, 10, 11, 12, 13]]))
    assert out.batch["attention_mask"][:, 4:].tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert out.batch["position_ids"][0].tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6]
    torch.testing.assert_close(out.batch["rollout_log_probs"][0], torch.tensor([-0.1, -0.2, 0.0, 0.0, 0.0]))
    assert llm.kwargs["load_format"] == "verl_canonical"
    assert sorted(out.batch.keys()) == sorted(
        ["prompts", "responses", "input_ids", "attention_mask", "position_ids", "rollout_log_probs"]
    )
    engine_lm_head = llm.model.lm_head.weight
    assert torch.equal(engine_lm_head, hf_model.lm_head.weight.detach().bfloat16().float())  # rollout dtype bf16


def test_meta_n_and_raw_prompt_ids(fake_vllm_package, tmp_path):
    """meta_info n=2 repeats rows interleaved (like the HF rollout); raw_prompt_ids, when the dataset provides them,
    are what the engine receives; validate=True with greedy val_kwargs sends temperature 0."""
    FakeLLM.hf_config = build_tiny_model("qwen3_5_moe", vocab_size=96).config
    rollout = rollout_module.vLLMRollout(rollout_config(free_cache_engine=False), HFModelConfig(path=str(tmp_path)))
    llm = FakeLLM.instances[0]
    llm.model = torch.nn.Linear(1, 1)  # real (non-NaN) weights: no sync needed for this test
    prompts = _prompts({"n": 2, "validate": True})
    prompts.non_tensor_batch["raw_prompt_ids"] = np.array([[3, 4], [7, 8]], dtype=object)
    out = rollout.generate_sequences(prompts)
    assert llm.calls[0][0] == "generate" and llm.calls[0][1]["temperature"] == 0.0
    assert [r["prompt_token_ids"] for r in llm.requests[0]] == [[3, 4], [3, 4], [7, 8], [7, 8]]
    assert out.batch["responses"][:, 0].tolist() == [5, 5, 9, 9] and len(out) == 4


def test_missing_vllm_or_vllm_ascend(monkeypatch, tmp_path, fake_vllm_package):
    """No vllm: ImportError naming `pip install verl[vllm]`; vllm without vllm-ascend on an NPU: ImportError naming
    vllm-ascend. Both before any engine is built."""
    monkeypatch.setattr(rollout_module, "get_device_name", lambda: "npu")
    with pytest.raises(ImportError, match="vllm-ascend platform plugin"):
        rollout_module.vLLMRollout(rollout_config(), HFModelConfig(path=str(tmp_path)))
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"pip install verl\[vllm\]"):
        rollout_module.vLLMRollout(rollout_config(), HFModelConfig(path=str(tmp_path)))
    assert FakeLLM.instances == []


def test_no_sleep_mode_on_the_platform(fake_vllm_package, monkeypatch, tmp_path, caplog):
    """free_cache_engine on a vLLM platform without sleep mode (the CPU build): the engine is built without it, never
    put to sleep, and one warning names the key."""
    for name, module in _fake_vllm_modules(sleep_mode=False).items():
        monkeypatch.setitem(sys.modules, name, module)
    FakeLLM.hf_config = build_tiny_model("qwen3_5_moe", vocab_size=96).config
    with caplog.at_level("WARNING"):
        rollout = rollout_module.vLLMRollout(rollout_config(), HFModelConfig(path=str(tmp_path)))
    llm = FakeLLM.instances[-1]
    assert llm.kwargs["enable_sleep_mode"] is False and llm.calls == []
    rollout.sleep()
    rollout.wake_up()
    assert llm.calls == []
    assert "actor_rollout_ref.rollout.free_cache_engine" in caplog.text


def test_multi_turn_is_rejected(fake_vllm_package, tmp_path):
    """multi_turn needs the agent-loop server, which this rollout does not have: a ConfigError names the key."""
    cfg = rollout_config(multi_turn=MultiTurnConfig(enable=True))
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.multi_turn.enable"):
        rollout_module.vLLMRollout(cfg, HFModelConfig(path=str(tmp_path)))


# ----------------------------------------------------------------------------------------------------------------
# tensor-parallel engine across 2 trainer ranks (gloo)
# ----------------------------------------------------------------------------------------------------------------


def _tp_worker(rank: int, port: int, out: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        _fake_vllm_module()  # installs vllm and the submodules vLLMRollout imports
        FakeLLM.hf_config = build_tiny_model("qwen3_5_moe", vocab_size=96).config
        mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "infer_tp"))
        cfg = rollout_config(free_cache_engine=False, tensor_model_parallel_size=2)
        rollout = rollout_module.vLLMRollout(cfg, HFModelConfig(path="/m"), device_mesh=mesh)
        llm = FakeLLM.instances[-1]
        llm.model = torch.nn.Linear(1, 1)
        prompts = _prompts().slice(rank, rank + 1)  # rank 0: row 0, rank 1: row 1
        result = rollout.generate_sequences(prompts)
        out[rank] = {
            "backend": llm.kwargs["distributed_executor_backend"],
            "requests": [r["prompt_token_ids"] for r in llm.requests[0]],
            "responses": result.batch["responses"].tolist(),
        }
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.dist
def test_tensor_parallel_ranks_submit_the_same_requests():
    """Two trainer ranks forming one TP=2 engine (mesh dim infer_tp): both engines receive the union of the two
    ranks' prompts in rank order, and each rank gets back only its own rows."""
    out = mp.Manager().dict()
    spawn(_tp_worker, args=(_free_port(), out), nprocs=2)
    for rank in (0, 1):
        assert out[rank]["backend"] == "external_launcher"
        assert out[rank]["requests"] == [[3, 4], [5, 6, 7, 8]]
    assert out[0]["responses"] == [[5, 6, PAD, PAD, PAD]] and out[1]["responses"] == [[9, 10, 11, 12, 13]]
