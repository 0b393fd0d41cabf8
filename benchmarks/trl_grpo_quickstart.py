"""TRL's ``GRPOTrainer`` on the CPU quickstart task: the baseline side of ``benchmarks/step_vs_trl.py``.

Runs in TRL's own virtualenv (``make bench-trl``; TRL is not a dependency of this package) and imports nothing from
``verl`` except the quickstart's reward, so that both sides score responses with the same function. Writes one JSON
line per optimizer step to ``--out``: the phase times (``gen``: TRL's ``_generate``, i.e. tokenising + HF generate +
decoding; ``score``: the rest of ``_generate_and_score_completions``, i.e. rewards and advantages; ``update``: the
step minus input preparation, i.e. forward + backward + optimizer; ``step``: the whole optimizer step), the mean
reward and the number of tokens (prompt + completion, unpadded) of the step.

The settings are the ones ``step_vs_trl.py`` lists as matched; they are written out here in ``grpo_config``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def grpo_config(work: Path, steps: int):
    """The quickstart's settings in TRL's names (see step_vs_trl.MATCHED)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(work / "trl_out"),
        max_steps=steps,
        per_device_train_batch_size=64,  # completions per step: 8 prompts x num_generations
        gradient_accumulation_steps=1,
        num_generations=8,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=4,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=2e-3,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        beta=0.0,
        router_aux_loss_coef=0.0,  # this project adds no MoE load-balancing loss to the policy loss
        epsilon=0.2,
        loss_type="dapo",  # token-level mean over the whole batch = verl's loss_agg_mode=token-mean
        scale_rewards="group",  # (r - group mean) / group std = verl's norm_adv_by_std_in_grpo=True
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=1,
        data_seed=1,
        dataloader_num_workers=0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        log_completions=False,
        disable_tqdm=True,
    )


class PhaseTimer:
    """Wraps the trainer's generation and scoring methods and writes one JSON line per optimizer step."""

    def __init__(self, trainer, out: Path):
        self.trainer, self.out = trainer, out
        self.gen = self.prepare = self.score_total = 0.0
        self.tokens = 0
        self.rewards: list[float] = []
        self._wrap("_generate", "gen")
        self._wrap("_generate_and_score_completions", "score_total", count_tokens=True)
        self._wrap("_prepare_inputs", "prepare")

    def _wrap(self, name: str, slot: str, count_tokens: bool = False) -> None:
        inner = getattr(self.trainer, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            result = inner(*args, **kwargs)
            setattr(self, slot, getattr(self, slot) + time.perf_counter() - t0)
            if count_tokens:
                self.tokens = int(result["prompt_mask"].sum() + result["completion_mask"].sum())
            return result

        setattr(self.trainer, name, timed)

    def callback(self):
        from transformers import TrainerCallback

        timer = self

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer.gen = timer.prepare = timer.score_total = 0.0
                timer.rewards.clear()
                timer.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                step = time.perf_counter() - timer.t0
                record = {
                    "global_step": state.global_step,
                    "gen": timer.gen,
                    "score": timer.score_total - timer.gen,
                    "update": step - timer.prepare,
                    "step": step,
                    "reward": sum(timer.rewards) / max(len(timer.rewards), 1),
                    "tokens": timer.tokens,
                }
                with open(timer.out, "a") as f:
                    f.write(json.dumps(record) + "\n")

        return _Callback()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    import pandas as pd
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from verl.trainer.quickstart import score

    timer_ref: list[PhaseTimer] = []

    def reward(prompts, completions, **kwargs):
        values = [score("", c[-1]["content"] if isinstance(c, list) else c, "") for c in completions]
        timer_ref[0].rewards.extend(values)
        return values

    frame = pd.read_parquet(args.train)[["prompt"]]
    frame["prompt"] = frame["prompt"].map(lambda msgs: [dict(m) for m in msgs])
    dataset = Dataset.from_list(frame.to_dict("records"))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=grpo_config(args.work, args.steps),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    timer = PhaseTimer(trainer, args.out)
    timer_ref.append(timer)
    trainer.add_callback(timer.callback())
    trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
