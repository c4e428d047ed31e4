"""The run directory: its layout (every path, `layout.py`) and its records, each read and written by one codec.

As runner/rendezvous/etcd/keys.py owns etcd's keys, this package owns the run dir's names: no other module of
runner/ spells `report.json`, `attempt_<k>` or `rank_<r>` (tests/rundir/test_rundir_names.py keeps it so).
"""
