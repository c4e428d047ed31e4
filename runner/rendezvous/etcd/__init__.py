"""The etcd v3 rendezvous.

The backend the agent uses (`backend`), and the admin operations of `runner status`, `runner stop` and `runner
reset` (`admin`).
"""
