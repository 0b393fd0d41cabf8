"""Model-specific code: per-model forwards and the patch registry (verl.models.transformers)."""
