"""Hang detection: the file-timer server (torch's wire format), the heartbeat monitor, py-spy stacks."""
