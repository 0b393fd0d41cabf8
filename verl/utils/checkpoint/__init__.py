"""Checkpoint managers (upstream layout: ``checkpoint_manager`` base, ``fsdp_checkpoint_manager``)."""
