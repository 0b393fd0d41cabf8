"""Shared utilities (device contract, torch functional, datasets, reward scores, checkpoints, tracking)."""
