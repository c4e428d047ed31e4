"""Health checks a node runs before it joins a rendezvous round (docs/health.md).

`check.py` runs one try of every check the spec's `health` section asks for and returns a `HealthReport`;
`until_healthy` tries again every retry_interval and gives up after give_up_after. The checks themselves:
`probes.py` (free disk space, free memory), `gpus.py` (nvidia-smi), `commands.py` (the user's command lines, each
in its own process group, killed whole at its timeout, output bounded). Nothing here knows the state machine:
the RENDEZVOUS state calls `until_healthy` before it joins.
"""
