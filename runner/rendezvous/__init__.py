"""Rendezvous backends: `local` (embedded, one node) and `etcd` (v3 API: external, or hosted by one node).

The agent picks one (runner.agent.backends); nothing here imports a backend it does not use.
"""
