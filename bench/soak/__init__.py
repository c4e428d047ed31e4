"""The chaos soak (`python bench/chaos.py`): its modules, each named for what it does (bench/soak/cli.py lists them)."""
