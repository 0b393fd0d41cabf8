"""The RL loop on a Ray single controller: one training step is a short numbered list of named calls.

::

     prompts (parquet → RLHFDataset → DataProto)
       │ 1 generate        actor_rollout.generate_sequences      (hf | vllm; weights synced by the worker)
       │ 2 reward          reward_fn(batch) → token_level_scores
       │ 3 old log-prob    actor_rollout.compute_log_prob        (+ entropy metric, rollout-vs-actor gap;
       │                                                         skipped when provably on-policy: on_policy.py)
       │ 4 ref log-prob    ref.compute_ref_log_prob              (if KL is used)
       │ 5 values          critic.compute_values                 (if GAE)
       │ 6 advantages      core_algos estimator by name          (driver, CPU)
       │ 7 update critic   critic.update_critic
       │ 8 update actor    actor_rollout.update_actor
       │ 9 curriculum      sampler.update(batch)                 (if data.sampler is a curriculum sampler)
       │ 10 log / validate / checkpoint

The driver holds the data (``DataProto`` on CPU); workers are reached only through their ``@register``-ed
methods, via the typed facades of :mod:`verl.trainer.ppo.worker_groups`.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf
from tqdm import tqdm

from verl import DataProto
from verl.single_controller.ray import (  # noqa: F401 - ResourcePoolManager: upstream imports it from here
    RayClassWithInitArgs,
    RayWorkerGroup,
    ResourcePoolManager,
    create_colocated_worker_cls,
)
from verl.trainer.ppo import core_algos, trainer_checkpoint
from verl.trainer.ppo.advantage_step import (  # upstream imports these three from here
    apply_kl_penalty,
    compute_advantage,
    compute_response_mask,
)
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    process_validation_metrics,
    reduce_metrics,
    validation_metric_dict,
)
from verl.trainer.ppo.on_policy import old_log_prob_skip_blocker
from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode, compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.utils import Role, need_critic, need_reference_policy
from verl.trainer.ppo.worker_groups import ActorRolloutRefGroup, CriticGroup
from verl.utils.debug.metrics import calculate_rollout_probs_diff_metrics
from verl.utils.profiler import marked_timer
from verl.utils.seqlen_balancing import balance_batch
from verl.workers.core.losses import ROLLOUT_CORRECTION_META_KEY

_GEN_TENSOR_KEYS = ["input_ids", "attention_mask", "position_ids"]
# multi_modal_inputs: the HF rollout generates from the processor's pixel values (a server rollout from
# multi_modal_data); the key stays in the batch too, for the actor's forward.
_GEN_NON_TENSOR_KEYS = [
    "raw_prompt_ids",
    "multi_modal_data",
    "multi_modal_inputs",
    "raw_prompt",
    "tools_kwargs",
    "interaction_kwargs",
]


class RayPPOTrainer:
    """PPO/GRPO on Ray: builds the worker groups, then runs :meth:`fit` (upstream's constructor signature)."""

    def __init__(
        self,
        config,
        tokenizer,
        role_worker_mapping: dict,
        resource_pool_manager,
        ray_worker_group_cls=RayWorkerGroup,
        processor=None,
        reward_fn=None,
        val_reward_fn=None,
        train_dataset=None,
        val_dataset=None,
        collate_fn=None,
        train_sampler=None,
        device_name: str | None = None,
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.processor = processor
        self.role_worker_mapping = role_worker_mapping
        self.resource_pool_manager = resource_pool_manager
        self.ray_worker_group_cls = ray_worker_group_cls
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.device_name = device_name or config.trainer.device
        self.use_reference_policy = need_reference_policy(config)
        self.use_critic = need_critic(config)
        self.kl_ctrl_in_reward = (
            core_algos.get_kl_controller(config.algorithm.kl_ctrl) if config.algorithm.use_kl_in_reward else None
        )
        self.global_steps = 0
        self._rollout_timing: dict[str, float] = {}
        self._last_val_metrics: dict[str, float] = {}
        # None: step 3 is skipped, old_log_probs = the update's own forward (exact here; see on_policy.py).
        self.old_log_prob_skip_blocker = old_log_prob_skip_blocker(config)
        self._create_dataloader(train_dataset, val_dataset, collate_fn, train_sampler)

    # ------------------------------------------------------------------ setup
    def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler) -> None:
        from torchdata.stateful_dataloader import StatefulDataLoader

        data = self.config.data
        self.train_dataloader = StatefulDataLoader(
            dataset=train_dataset,
            batch_size=data.train_batch_size,
            num_workers=data.dataloader_num_workers,
            drop_last=True,
            collate_fn=collate_fn,
            sampler=train_sampler,
        )
        self.val_dataloader = None
        if val_dataset is not None and len(val_dataset) > 0:
            val_batch_size = data.val_batch_size or len(val_dataset)
            self.val_dataloader = StatefulDataLoader(
                dataset=val_dataset,
                batch_size=val_batch_size,
                num_workers=data.dataloader_num_workers,
                shuffle=False,
                drop_last=False,
                collate_fn=collate_fn,
            )
        if len(self.train_dataloader) == 0:
            raise ValueError(
                f"data.train_batch_size={data.train_batch_size} is larger than the training set "
                f"({len(train_dataset)} prompts); lower data.train_batch_size"
            )
        total = len(self.train_dataloader) * self.config.trainer.total_epochs
        if self.config.trainer.total_training_steps is not None:
            total = self.config.trainer.total_training_steps
        self.total_training_steps = total
        OmegaConf.set_struct(self.config, False)
        self.config.actor_rollout_ref.actor.optim.total_training_steps = total
        if self._bypass_mode:  # the actor's loss reads the rollout's log-probs as old log-probs
            self.config.actor_rollout_ref.actor.policy_loss.loss_mode = "bypass_mode"
        if self.use_critic:
            self.config.critic.optim.total_training_steps = total
        OmegaConf.set_struct(self.config, True)

    def init_workers(self) -> None:
        """Create one colocated worker group per resource pool; init critic and ref first, the actor last."""
        self.resource_pool_manager.create_resource_pool()
        class_by_pool: dict = {}

        def add(role: Role, name: str, ray_cls: RayClassWithInitArgs) -> None:
            pool = self.resource_pool_manager.get_resource_pool(role)
            class_by_pool.setdefault(pool, {})[name] = ray_cls

        actor_role = Role.ActorRollout
        add(
            actor_role,
            "actor_rollout",
            self._ray_cls(actor_role, config=self.config.actor_rollout_ref, role="actor_rollout"),
        )
        if self.use_critic:
            add(Role.Critic, "critic", self._ray_cls(Role.Critic, config=self.config.critic))
        if self.use_reference_policy:
            add(Role.RefPolicy, "ref", self._ray_cls(Role.RefPolicy, config=self.config.actor_rollout_ref, role="ref"))

        groups: dict[str, object] = {}
        for pool, class_dict in class_by_pool.items():
            worker_dict_cls = create_colocated_worker_cls(class_dict=class_dict)
            wg = self.ray_worker_group_cls(
                resource_pool=pool, ray_cls_with_init=worker_dict_cls, device_name=self.device_name
            )
            groups.update(wg.spawn(prefix_set=class_dict.keys()))

        self.critic_wg = CriticGroup(groups["critic"]) if self.use_critic else None
        self.ref_policy_wg = ActorRolloutRefGroup(groups["ref"]) if self.use_reference_policy else None
        self.actor_rollout_wg = ActorRolloutRefGroup(groups["actor_rollout"])
        if self.critic_wg is not None:
            self.critic_wg.init_model()
        if self.ref_policy_wg is not None:
            self.ref_policy_wg.init_model()
        self.actor_rollout_wg.init_model()  # last: a vLLM rollout sizes its cache from what is left

    def _ray_cls(self, trainer_role: Role, **worker_kwargs) -> RayClassWithInitArgs:
        if trainer_role not in self.role_worker_mapping:
            raise ValueError(f"no worker class registered for role {trainer_role}")
        return RayClassWithInitArgs(cls=self.role_worker_mapping[trainer_role], **worker_kwargs)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        """Train for ``total_training_steps``; returns the metrics of the last step."""
        from verl.utils.tracking import Tracking

        trainer_cfg = self.config.trainer
        logger = Tracking(
            project_name=trainer_cfg.project_name,
            experiment_name=trainer_cfg.experiment_name,
            default_backend=trainer_cfg.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
        )
        self._load_checkpoint()
        records: list[tuple[int, dict[str, float]]] = []
        if self.val_reward_fn is not None and trainer_cfg.val_before_train and self.val_dataloader is not None:
            val_metrics = self._timed_validate()
            logger.log(data=val_metrics, step=self.global_steps)
            records.append((self.global_steps, val_metrics))
            if trainer_cfg.val_only:
                self._print_final_validation()
                logger.finish()
                return val_metrics
        history: list[float] = []
        last_metrics: dict[str, float] = {}
        progress = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training Progress")
        while self.global_steps < self.total_training_steps:
            for batch_dict in self.train_dataloader:
                self.global_steps += 1
                last_metrics = self._train_step(DataProto.from_single_dict(batch_dict))
                self._after_step(last_metrics)
                logger.log(data=last_metrics, step=self.global_steps)
                records.append((self.global_steps, last_metrics))
                history.append(last_metrics.get("critic/score/mean", float("nan")))
                progress.set_postfix(score=f"{history[-1]:.3f}")
                progress.update(1)
                if self.global_steps >= self.total_training_steps:
                    break
        progress.close()
        self._print_summary(history)
        self._print_final_validation()
        self._write_metrics_plot(records, logger.log_dir)
        logger.finish()
        return last_metrics

    def _train_step(self, batch: DataProto) -> dict[str, float]:
        """One RL step over a batch of prompts; returns its metrics."""
        timing: dict[str, float] = {}
        metrics: dict[str, float] = {}
        with marked_timer("step", timing):
            with marked_timer("gen", timing):
                batch = self._generate(batch)  # 1
            if self.config.trainer.balance_batch:
                metrics.update(balance_batch(batch, self.actor_rollout_wg.world_size))  # DP ranks: equal tokens
            with marked_timer("reward", timing):
                self._compute_reward(batch, metrics)  # 2
            if self.old_log_prob_skip_blocker is not None:
                with marked_timer("old_log_prob", timing):
                    self._compute_old_log_prob(batch, metrics)  # 3 (else: the update's first forward, on_policy.py)
            if self.use_reference_policy:
                with marked_timer("ref", timing):
                    batch = batch.union(self.ref_policy_wg.compute_ref_log_prob(batch))  # 4
            if self.use_critic:
                with marked_timer("values", timing):
                    batch = batch.union(self.critic_wg.compute_values(batch))  # 5
            with marked_timer("adv", timing):
                self._compute_advantage(batch, metrics)  # 6
            if self.use_critic:
                with marked_timer("update_critic", timing):
                    out = self.critic_wg.update_critic(batch)  # 7
                    metrics.update(reduce_metrics(out.meta_info["metrics"]))
            if self.global_steps > self.config.trainer.critic_warmup:
                with marked_timer("update_actor", timing):
                    batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
                    if self._bypass_mode:
                        batch.meta_info[ROLLOUT_CORRECTION_META_KEY] = self._rollout_correction_dict()
                    out = self.actor_rollout_wg.update_actor(batch)  # 8
                    metrics.update(reduce_metrics(out.meta_info["metrics"]))
            self._update_curriculum(batch)  # 9
        self._dump_rollouts(batch)
        metrics["training/global_step"] = self.global_steps
        # 0-based epoch of this step; stateless, so it stays right after a resume mid-epoch (drop_last=True).
        metrics["training/epoch"] = (self.global_steps - 1) // len(self.train_dataloader)
        timing.update(self._rollout_timing)  # update_weights, measured on the rollout workers inside `gen`
        metrics.update(compute_data_metrics(batch, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughout_metrics(batch, timing, n_gpus=self.resource_pool_manager.get_n_gpus()))
        return metrics

    # ------------------------------------------------------------------ steps
    def _update_curriculum(self, batch: DataProto) -> None:
        """A curriculum sampler (``data.sampler``) sees every finished step before the next batch is drawn."""
        from verl.experimental.dataset.sampler import AbstractCurriculumSampler

        sampler = getattr(self.train_dataloader, "sampler", None)
        if isinstance(sampler, AbstractCurriculumSampler):
            sampler.update(batch=batch)

    def _generate(self, batch: DataProto) -> DataProto:
        """Step 1: n responses per prompt; returns the prompt batch repeated n times joined with the responses."""
        rollout_n = self.config.actor_rollout_ref.rollout.n
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        gen_batch = self._gen_batch(batch)
        gen_batch.meta_info.update(self._gen_meta_info(validate=False))
        gen_output = self.actor_rollout_wg.generate_sequences(gen_batch.repeat(rollout_n, interleave=True))
        self._rollout_timing = _slowest_rank_timing(gen_output)
        batch = batch.repeat(rollout_n, interleave=True).union(gen_output)
        batch.batch["response_mask"] = compute_response_mask(batch)
        return batch

    def _gen_batch(self, batch: DataProto) -> DataProto:
        non_tensor_keys = [k for k in _GEN_NON_TENSOR_KEYS if k in batch.non_tensor_batch]
        gen_batch = batch.pop(batch_keys=_GEN_TENSOR_KEYS, non_tensor_batch_keys=non_tensor_keys)
        # The prompts stay in `batch` too: the rollout output carries input_ids etc. for the full sequence.
        batch.non_tensor_batch.update({k: gen_batch.non_tensor_batch[k] for k in non_tensor_keys})
        return gen_batch

    def _gen_meta_info(self, validate: bool) -> dict:
        return {
            "eos_token_id": self.tokenizer.eos_token_id,
            "pad_token_id": self.tokenizer.pad_token_id,
            "recompute_log_prob": False,
            "do_sample": not validate or self.config.actor_rollout_ref.rollout.val_kwargs.do_sample,
            "validate": validate,
            "global_steps": self.global_steps,
        }

    def _compute_reward(self, batch: DataProto, metrics: dict) -> None:
        """Step 2: rule/custom reward → ``token_level_scores`` (+ per-sample extra info and failure counters)."""
        result = self.reward_fn(batch, return_dict=True)
        batch.batch["token_level_scores"] = result["reward_tensor"]
        for key, values in result.get("reward_extra_info", {}).items():
            values = np.asarray(values)
            if len(values) == len(batch):
                batch.non_tensor_batch[key] = values
            if values.dtype.kind in "biuf" and values.size > 0:
                metrics[f"reward_extra/{key}/mean"] = float(values.astype(np.float64).mean())
        for key, value in result.get("reward_metrics", {}).items():
            metrics[key] = float(value)

    @property
    def _bypass_mode(self) -> bool:
        corr = self.config.algorithm.get("rollout_correction")
        return bool(corr is not None and corr.get("bypass_mode", False))

    def _rollout_correction_dict(self) -> dict:
        corr = OmegaConf.to_container(self.config.algorithm.rollout_correction, resolve=True)
        corr.pop("_target_", None)
        return corr

    def _compute_old_log_prob(self, batch: DataProto, metrics: dict) -> None:
        """Step 3: log-probs of the sampled tokens under the current policy (+ the entropy metric), then rollout
        correction (``algorithm.rollout_correction``: IS weights, rejection, ``rollout_corr/*`` metrics) when the
        rollout returned its log-probs. Bypass mode skips the forward: the rollout's log-probs are the old ones."""
        if self._bypass_mode:
            apply_bypass_mode(batch)
            return
        old = self.actor_rollout_wg.compute_log_prob(batch)
        if "entropys" in old.batch.keys():
            entropy = core_algos.agg_loss(
                loss_mat=old.batch["entropys"],
                loss_mask=batch.batch["response_mask"],
                loss_agg_mode=self.config.actor_rollout_ref.actor.loss_agg_mode,
            )
            metrics["actor/entropy"] = entropy.item()
            old.batch.pop("entropys")
        metrics.update(reduce_metrics(old.meta_info.pop("metrics", {})))
        batch.union(old)
        if "rollout_log_probs" in batch.batch.keys():  # rollout.calculate_log_probs: the training-inference gap
            metrics.update(calculate_rollout_probs_diff_metrics(batch))
            corr = self.config.algorithm.get("rollout_correction")
            if corr is not None:
                _, corr_metrics = compute_rollout_correction_and_add_to_batch(batch, self._rollout_correction_dict())
                metrics.update(corr_metrics)

    def _compute_advantage(self, batch: DataProto, metrics: dict) -> None:
        """Step 6: optional KL penalty in the reward, then the configured advantage estimator (on the driver)."""
        algo = self.config.algorithm
        if algo.use_kl_in_reward:
            _, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl_in_reward, kl_penalty=algo.kl_penalty)
            metrics.update(kl_metrics)
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        compute_advantage(
            batch,
            adv_estimator=algo.adv_estimator,
            gamma=algo.gamma,
            lam=algo.lam,
            num_repeat=self.config.actor_rollout_ref.rollout.n,
            norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
            config=algo,
        )

    # ------------------------------------------------------------------ validation
    def _timed_validate(self) -> dict[str, float]:
        """:meth:`_validate` plus ``timing_s/testing``; remembers the result for the final summary."""
        start = time.perf_counter()
        metrics = self._validate()
        self._last_val_metrics = dict(metrics)
        metrics["timing_s/testing"] = time.perf_counter() - start
        return metrics

    def _validate(self) -> dict[str, float]:
        """Generation (greedy or ``val_kwargs``) over the validation set, scored by ``val_reward_fn``.

        Every prompt gets ``val_kwargs.n`` responses; the metrics are upstream's: ``val-core/<source>/<var>/
        mean@N`` (and ``best@N``/``maj@N`` when N > 1), the rest (std, worst, smaller n, extra variables the reward
        function reports) under ``val-aux/``.
        """
        data_sources: list[str] = []
        uids: list[str] = []
        infos: dict[str, list] = {"reward": []}
        n = self.config.actor_rollout_ref.rollout.val_kwargs.n
        for batch_dict in self.val_dataloader:
            batch = DataProto.from_single_dict(batch_dict)
            batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
            gen_batch = self._gen_batch(batch)
            gen_batch.meta_info.update(self._gen_meta_info(validate=True))
            output = self._generate_padded(gen_batch.repeat(n, interleave=True))
            output.meta_info.pop("metrics", None)
            batch = batch.repeat(n, interleave=True).union(output)
            batch.batch["response_mask"] = compute_response_mask(batch)
            result = self.val_reward_fn(batch, return_dict=True)
            infos["reward"].extend(result["reward_tensor"].sum(-1).tolist())
            for key, values in result.get("reward_extra_info", {}).items():
                infos.setdefault(key, []).extend(list(values))
            data_sources.extend(batch.non_tensor_batch["data_source"].tolist())
            uids.extend(batch.non_tensor_batch["uid"].tolist())
        infos = {key: values for key, values in infos.items() if _reportable(values, len(uids))}
        return validation_metric_dict(process_validation_metrics(data_sources, uids, infos))

    def _generate_padded(self, gen_batch: DataProto) -> DataProto:
        """Generate for a batch whose size need not divide the worker count (pad, generate, unpad)."""
        from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto

        padded, pad_size = pad_dataproto_to_divisor(gen_batch, self.actor_rollout_wg.world_size)
        return unpad_dataproto(self.actor_rollout_wg.generate_sequences(padded), pad_size=pad_size)

    # ------------------------------------------------------------------ after a step
    def _after_step(self, metrics: dict[str, float]) -> None:
        trainer_cfg = self.config.trainer
        is_last = self.global_steps >= self.total_training_steps
        if trainer_cfg.save_freq > 0 and (self.global_steps % trainer_cfg.save_freq == 0 or is_last):
            start = time.perf_counter()
            self._save_checkpoint()
            metrics["timing_s/save_checkpoint"] = time.perf_counter() - start
        if (
            self.val_reward_fn is not None
            and self.val_dataloader is not None
            and trainer_cfg.test_freq > 0
            and (self.global_steps % trainer_cfg.test_freq == 0 or is_last)
        ):
            metrics.update(self._timed_validate())

    def _dump_rollouts(self, batch: DataProto) -> None:
        out_dir = self.config.trainer.rollout_data_dir
        if not out_dir:
            return
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        prompts = self.tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
        responses = self.tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True)
        scores = batch.batch["token_level_scores"].sum(-1).tolist()
        with open(Path(out_dir) / f"{self.global_steps}.jsonl", "w") as f:
            for prompt, response, score in zip(prompts, responses, scores, strict=True):
                f.write(json.dumps({"input": prompt, "output": response, "score": score, "step": self.global_steps}))
                f.write("\n")

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self) -> None:
        """Step directory ``global_step_N``: actor, critic, dataloader + driver state; committed durably. A failure
        (a full disk) raises CheckpointSaveError naming the path, the free space and the intact previous one."""
        trainer_cfg = self.config.trainer

        def write_parts(tmp: Path) -> None:
            self.actor_rollout_wg.save_checkpoint(str(tmp / "actor"), self.global_steps)
            if self.use_critic:
                self.critic_wg.save_checkpoint(str(tmp / "critic"), self.global_steps)
            extra = {"kl_coef": self.kl_ctrl_in_reward.value if self.kl_ctrl_in_reward is not None else None}
            trainer_checkpoint.save_driver_state(tmp, self.train_dataloader.state_dict(), extra)

        trainer_checkpoint.save_step(
            trainer_cfg.default_local_dir, self.global_steps, write_parts, trainer_cfg.max_actor_ckpt_to_keep
        )

    def _load_checkpoint(self) -> None:
        trainer_cfg = self.config.trainer
        point = trainer_checkpoint.find_resume_point(
            trainer_cfg.resume_mode, trainer_cfg.default_local_dir, trainer_cfg.resume_from_path
        )
        if point is None:
            return
        print(f"[verl] resuming from {point.path} (global step {point.global_step})", flush=True)
        self.global_steps = point.global_step
        self.actor_rollout_wg.load_checkpoint(str(point.path / "actor"))
        if self.use_critic:
            self.critic_wg.load_checkpoint(str(point.path / "critic"))
        state = trainer_checkpoint.load_driver_state(point.path)
        self.train_dataloader.load_state_dict(state["dataloader"])
        if self.kl_ctrl_in_reward is not None and state["extra"]["kl_coef"] is not None:
            self.kl_ctrl_in_reward.value = state["extra"]["kl_coef"]

    def _print_summary(self, history: list[float]) -> None:
        if not history:
            return
        window = min(5, len(history))
        first, last = float(np.nanmean(history[:window])), float(np.nanmean(history[-window:]))
        print(
            f"[verl] trained {len(history)} steps: mean score of the first {window} steps {first:.3f}, "
            f"of the last {window} steps {last:.3f} (Δ {last - first:+.3f})",
            flush=True,
        )

    def _print_final_validation(self) -> None:
        """The last validation's headline numbers (``val-core``), one per line, after the run."""
        core = {k: v for k, v in self._last_val_metrics.items() if k.startswith("val-core/")}
        if not core:
            return
        lines = [f"  {name}: {value:.4f}" for name, value in sorted(core.items())]
        print("[verl] final validation metrics:\n" + "\n".join(lines), flush=True)

    def _write_metrics_plot(self, records: list[tuple[int, dict[str, float]]], log_dir: str | None) -> None:
        """``<log_dir>/metrics.png``: reward and the key metrics per step, from ``metrics.jsonl`` when the file
        logger wrote one, else from this run's records (skipped, said once, without matplotlib)."""
        from verl.utils.plot_metrics import PlotUnavailableError, write_metrics_png

        if log_dir is None or not records:
            return
        from verl.utils.plot_metrics import read_metrics_jsonl
        from verl.utils.tracking import METRICS_FILE

        history_file = Path(log_dir) / METRICS_FILE
        if history_file.is_file():  # the whole run, also the steps before a resume
            records = read_metrics_jsonl(history_file)
        try:
            path = write_metrics_png(records, Path(log_dir) / "metrics.png", title=self.config.trainer.experiment_name)
        except PlotUnavailableError as exc:
            print(f"[verl] no metrics plot: {exc}", flush=True)
            return
        print(f"[verl] metrics plot: {path}", flush=True)


def _slowest_rank_timing(output: DataProto) -> dict[str, float]:
    """``{"update_weights": s}`` from the rollout workers' metrics (the slowest rank: the step waits for it)."""
    per_rank = output.meta_info.pop("metrics", {}).get("timing_s/update_weights")
    if not per_rank:
        return {}
    values = per_rank if isinstance(per_rank, list | tuple) else [per_rank]
    return {"update_weights": float(max(values))}


def _reportable(values: list, num_samples: int) -> bool:
    """A validation variable with one value per response that is all numbers (averaged) or all strings (``pred``,
    used for majority voting)."""
    if len(values) != num_samples or num_samples == 0:
        return False
    if all(isinstance(v, str) for v in values):
        return True
    return all(isinstance(v, int | float | np.number | np.bool_) for v in values)
