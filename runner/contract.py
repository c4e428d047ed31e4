"""The variables runner adds to a worker's environment beyond torchrun's contract (docs/torchrun.md).

The workers layer writes them, the watchdog and the worker-side helpers read them; both import this module (the
foundation layer) so neither imports the other for a name.
"""

HEARTBEAT_FILE_VAR = "RUNNER_HEARTBEAT_FILE"  # a file the worker touches; the agent times its changes
CODE_ENDED_FILE = "code_ended"  # in a worker's log dir: its code and atexit handlers ended cleanly (standby_main)
