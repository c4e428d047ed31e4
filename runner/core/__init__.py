"""The agent's core: the state machine, the context the handlers share, the restart policy."""
