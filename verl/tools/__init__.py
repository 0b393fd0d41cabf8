"""Command-line tools that inspect a config without starting a run (``python -m verl.tools.<name>``)."""
