"""Experimental utilities kept under upstream's import path (`verl.utils.experimental.torch_functional`)."""
