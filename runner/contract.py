"""The variables runner adds to a worker's environment beyond torchrun's contract (docs/torchrun.md).

The workers layer writes them, the watchdog and the worker-side helpers read them; both import this module (the
foundation layer) so neither imports the other for a name.
"""

HEARTBEAT_FILE_VAR = "RUNNER_HEARTBEAT_FILE"  # a file the worker touches; the agent times its changes
CODE_ENDED_FILE = "code_ended"  # in a worker's log dir: its code and atexit handlers ended cleanly (standby_main)
# A socket path per worker: torch's worker server answers the agent's flight-recorder query there (docs/hangs.md)
FLIGHT_SOCKET_VAR = "RUNNER_FLIGHT_RECORDER_SOCKET"
FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # torch reads the first, then the second
# Where an agent finds the job's secret file when the spec's rendezvous.secret_file is not set (docs/security.md);
# the templates set it on every node, and it never reaches a worker
SECRET_ENV = "RUNNER_SECRET_FILE"  # noqa: S105 - the name of a variable, not a secret
# The hosts a hosted rendezvous's etcd members run on (comma-separated names), set by the cluster templates: the
# agent also looks for the rendezvous there (runner.rendezvous.etcd.hosted, docs/clusters.md).
HOSTED_NODES_ENV = "RUNNER_HOSTED_NODES"
# host:port of a hosted rendezvous, set by a cluster template in place of a spec's endpoint on a fixed host (the
# allocation's first node): the loader puts it in rendezvous.endpoints (runner/config/hosted_endpoint.py).
HOSTED_ENDPOINT_ENV = "RUNNER_HOSTED_ENDPOINT"
