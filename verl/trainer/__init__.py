"""Trainers: the PPO/GRPO entry point (``python -m verl.trainer.main_ppo``), its configs and the RL algorithms.

Importing this package has no side effects and imports neither Ray nor transformers.
"""
