"""Helpers for tests that users and engineers can reuse (multi-process gloo runs)."""
