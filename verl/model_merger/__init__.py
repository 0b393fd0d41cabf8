"""Merge a sharded FSDP checkpoint into an ordinary HF model directory (upstream's ``python -m verl.model_merger``)."""
