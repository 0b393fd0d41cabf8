"""vLLM rollout (GPU, and Ascend through vllm-ascend). Importing this package does not import vLLM."""

from verl.workers.rollout.vllm_rollout.vllm_rollout import vLLMRollout

__all__ = ["vLLMRollout"]
