"""HF transformers models: the explicit patch registry and the per-model patches it applies."""
