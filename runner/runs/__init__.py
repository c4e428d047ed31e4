"""The bookkeeping of runs: the runs index, `runner status` and `runner stop`/`reset` (control)."""
