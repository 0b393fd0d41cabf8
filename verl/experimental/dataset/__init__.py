"""Dataset-side extension points (custom samplers)."""
