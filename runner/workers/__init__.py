"""Workers.

The launch plan (argv and environment per rank), the group that spawns and stops them, the shepherd that kills them
if the agent dies, the tee of their output, and the failure report of a worker that died.
"""
