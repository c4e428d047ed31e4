"""The diagnosis: what turns a failed attempt's evidence into one `Failure`, the record every layer above reads.

- failure.py: the record (kind, class, reason, the rank and its logs, the hang's verdict, a lost peer), the class a
  kind gets before any evidence (`default_class`), and the failure of a worker's exit (`worker_failure`).
- evidence.py: what a failed worker left, read as text: its last traceback, torch's error file, its stderr's tail,
  and the collateral rule (`COLLATERAL`, `collateral`: the words a rank prints when another one died first), stated
  once, as data; the tee (runner.workers.tee) and the group's blame (runner.workers.group) read the same rule.
- hang.py: a failure joined with the flight recorder's verdict (runner.hangs): the culprit of a hang or a collective
  mismatch as the root cause.
- oom.py: the kernel's OOM killer at work, from the worker's cgroup or the kernel log: the `oom` class's evidence
  (`classed`: a worker's failure classed on it).

The states (runner.states.running, runner.states.failed) gather the evidence (exits, the recorder, other nodes'
news) and ask these modules what it means; they only record the answer.
"""
