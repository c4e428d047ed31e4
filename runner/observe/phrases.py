"""The console's words for the agent's warnings and errors: event name -> a plain sentence from the event's fields.

An event that says itself (a `message` field) is printed as it says; every other warning or error, and every info
event shown at the normal level, is looked up here, so the console never prints an event's name and its fields as
`key=value` (issue 40: one console language). agent.jsonl keeps the raw event, unchanged.

Each entry is one or more templates, tried in order: the first whose plain slots all have a value is used, else the
last, which should need none (a plain slot left without a value reads `?`). The language:

- `{field}`: the field's value in words: a list as `a, b, c, +4`, a mapping as `k: v, ...`, a long text cut
  (`short`), a control character escaped (`printable`), never a literal escape sequence;
- `{field:s}`: a number of seconds, `3 s`; `{field:sig}`: a signal number by its name, `SIGKILL` (0: `no signal`);
  `{field:long}`: a sentence the code wrote (cut at 400 characters);
- `[ ... ]`: an optional part, left out when a field in it has no value (absent, None, '' or empty).

The value helpers (`short`, `names`, `printable`) live here too: the console's other lines use them.

`tests/observe/test_console_phrases.py` keeps the table whole: every warning and error the code emits (by its
literal name) has a `message=` at its call or an entry here, every entry is emitted somewhere, and each renders, with
its call's fields or none, as words.
"""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from runner.rundir.layout import TRANSITIONS


@dataclass(frozen=True)
class Phrase:
    """An event's sentence (the first template whose plain slots are all filled) and an optional hint under it."""

    say: tuple[str, ...]
    hint: str = ""


def phrase(*say: str, hint: str = "") -> Phrase:
    """A table entry: templates in order of preference, the last the fallback."""
    return Phrase(say, hint)


LIGHTHOUSE = "the TorchFT lighthouse (the replica groups' coordinator) this node hosts"
SHEPHERD = "the guard process (it kills the workers if the agent dies)"
ETCD_FIX = "check that etcd is up and reachable from this node (rendezvous.endpoints)"
NOT_WRITTEN = "; the job goes on"


def unwritten(what: str, after: str = NOT_WRITTEN) -> Phrase:
    """A record the disk refused: `could not write <what> <path>: <error>; the job goes on`."""
    return phrase(f"could not write {what}[ {{path}}][: {{error:long}}]{after}")


PHRASES: dict[str, Phrase] = {
    # --- etcd and the rendezvous ---
    "etcd_call_failed": phrase("an etcd request[ ({call})] failed[: {error:long}]"),
    "etcd_call_retry": phrase("etcd did not answer[ ({error:long})]; trying again", hint=ETCD_FIX),
    "etcd_connect_retry": phrase("etcd[ at {endpoint}] did not answer[ ({error:long})][: {detail:long}]",
                                 hint=ETCD_FIX),
    "etcd_data_lost": phrase("etcd lost this job's data[: {reason:long}]"),
    "etcd_job_readmitted": phrase("this node joined the job again in an etcd that lost its data[ ({reason:long})]"
                                  "[; restarts counted so far: {restarts}]"),
    "etcd_lease_expired_regranted": phrase("this node's etcd lease expired[ ({old})]: a new one was granted[ ({new})]"
                                           "[ and its {keys} key(s) written again]"),
    "etcd_lease_keepalive_failed": phrase("could not renew this node's etcd lease[: {error:long}]; trying again",
                                          hint=ETCD_FIX),
    "etcd_monitor_retry": phrase("watching the job in etcd failed[: {error:long}]; trying again", hint=ETCD_FIX),
    "etcd_silent_peers_reachable": phrase(
        "etcd does not renew this node's lease[ ({lease_left_s:s} of it left)], yet the network reaches its peers"
        "[ ({reached})]: etcd is away for every node; the workers keep running"),
    "etcd_task_failed": phrase("an etcd background task[ ({task})] failed[: {error:long}]"),
    "etcd_watch_compacted": phrase("etcd no longer has the history this node watches from[ (revision {revision})]: "
                                   "watching from the oldest it has[ (revision {oldest})]"),
    "etcd_watch_lost": phrase("lost etcd's feed of the other nodes' news (its member or the link went away): "
                              "following it again from where it stopped[ (revision {resume_from})]"),
    "fence_peer_unknown": phrase("could not read where the round's other nodes[ ({nodes})] run, to reach them if "
                                 "etcd goes away[: {error:long}]"),
    "fence_peer_unresolved": phrase("could not resolve the address of a node of the round[ ({host})], to reach it if "
                                    "etcd goes away[: {error:long}]"),
    "fenced": phrase("this node fenced itself: etcd stopped renewing its lease and no node of the round answers"
                     "[ ({peers})]; its workers stop[ with {lease_left_s:s} of the lease left] and the other nodes go "
                     "on without it"),
    "hang_answers_incomplete": phrase("not every node sent its hang records[ for round {round}][ (answered: "
                                      "{answered})][: {error:long}]"),
    "node_ledger_read_failed": phrase("could not read the node ledger (each node's failures across runs) from etcd"
                                      "[: {error:long}]"),
    "node_ledger_write_failed": phrase("could not record this node's failure in the node ledger (each node's failures"
                                       " across runs)[ {path}][: {error:long}]"),
    "progress_of_nodes_unread": phrase("could not read the other nodes' progress from etcd[: {error:long}]"),
    "rendezvous_again_after_data_loss": phrase("etcd lost the job's data during the rendezvous: joining again"
                                               "[ (attempt {attempt})]"),
    "rendezvous_close_failed": phrase("could not close the job's rendezvous[: {error:long}]"),
    "rendezvous_lead_lost": phrase("this node no longer leads rendezvous round {round} (its leader key in etcd is "
                                   "gone): it reads the round again",
                                   "this node no longer leads its rendezvous round (its leader key in etcd is gone): it"
                                   " reads the round again"),
    "rendezvous_lost": phrase("{reason:long}", "the rendezvous is lost: the job cannot go on"),
    "rendezvous_loopback_endpoint": phrase(
        "the rendezvous endpoint[ {endpoint}] is a loopback address: only agents on this machine can join this job",
        hint="give an address the other nodes reach (rendezvous.endpoints, or --advertise-addr when a node hosts it)"),
    "rendezvous_member_leave_failed": phrase("this node could not leave the etcd cluster it hosts a member of"
                                             "[: {error:long}]"),
    "rendezvous_member_not_added": phrase("could not add this node as a member of the hosted etcd[: {error:long}]"),
    "rendezvous_member_not_removed": phrase("could not remove the lost member[ {member}] from the hosted etcd"
                                            "[: {error:long}]"),
    "rendezvous_member_removed": phrase("removed the member[ {member}] from the hosted etcd[: {reason:long}]"),
    "rendezvous_members_unchanged": phrase("could not change the hosted etcd's members[: {error:long}]"),
    "rendezvous_round_left": phrase(
        "this node left rendezvous round {round} for the open round[ {current}][: {detail:long}]",
        "this node left its rendezvous round for the open one[: {detail:long}]"),
    "rendezvous_seat_of_predecessor": phrase(
        "rendezvous round {round} closed with this node's name, but from a join written before this agent "
        "started: it joins the next round",
        "a rendezvous round closed with this node's name, but from a join written before this agent started: it "
        "joins the next round"),
    "replica_seat_release_failed": phrase("could not give back this replica group's seat in etcd[: {error:long}]"),
    "status_publish_failed": phrase("could not publish this node's status to etcd[: {error:long}]; `runner status` "
                                    "may lag"),
    # --- the etcd this node hosts (rendezvous.hosted) ---
    "hosted_etcd_data_lost": phrase("the data dir of the etcd this node hosts is gone[ ({data_dir})][: {detail:long}]"),
    "hosted_etcd_gone": phrase("the etcd this node hosts is gone for good[: {reason:long}][; its log: {log}]"),
    "hosted_etcd_killed": phrase("the etcd this node hosts did not stop[ within {after_s:s}]: killed"),
    "hosted_etcd_log_unwritable": unwritten("the log of the etcd this node hosts"),
    "hosted_etcd_restarting": phrase("the etcd this node hosts exited[ ({exit:long})]: restarting it[ (restart "
                                     "{restart})][ in {after_s:s}]"),
    "hosted_etcd_stopping_with_live_nodes": phrase(
        "the etcd this node hosts stops while other nodes still run[ ({nodes})][, after waiting {waited_s:s}]"
        "[: {error:long}]"),
    "hosted_stop_request_failed": phrase("could not ask the other nodes to stop[: {error:long}]"),
    # --- replica groups and their lighthouse ---
    "lighthouse_address_unread": phrase("could not read the TorchFT lighthouse's address from etcd[: {error:long}]; "
                                        "the groups run on, the next look tries again"),
    "lighthouse_gone": phrase(f"{LIGHTHOUSE} is gone for good[: {{reason:long}}][; its log: {{log}}]"),
    "lighthouse_log_write_failed": unwritten(f"the log of {LIGHTHOUSE}"),
    "lighthouse_moved": phrase("the TorchFT lighthouse moved[ to {address}][: {detail:long}]"),
    "lighthouse_restarting": phrase(f"{LIGHTHOUSE} exited[ ({{exit:long}})]: restarting it[ (restart {{restart}})]"
                                    "[ in {after_s:s}]"),
    "lighthouse_taken_over": phrase("the host of the TorchFT lighthouse[ ({lost})] was lost: this node hosts the "
                                    "next one[ at {address}]"),
    "replica_minimum_lost": phrase("the job stops its replica groups: {reason:long}",
                                   "the job stops its replica groups: too few can go on"),
    "replica_start_failed": phrase("the replica groups could not start[: {error:long}]", hint="{fix:long}"),
    "torchft_version_unchecked": phrase("the TorchFT version could not be checked[: {detail:long}]"),
    "group_dir_unwritable": unwritten("a replica group's folder", "; the group runs, its records may be lost"),
    # --- the watchdog ---
    "hang_culprit": phrase("{reason:long}[ (found in {took_s:s})]",
                           "a hang was examined[: culprit rank(s) {culprits}][ (in {took_s:s})]"),
    "hang_culprit_failed": phrase("naming the hang's culprit failed[: {exception:long}]; the hang is reported as it "
                                  "was seen"),
    "heartbeat_callback_failed": phrase("handling a silent worker[ (local rank {local_rank})] failed"
                                        "[: {exception:long}]; the watch goes on"),
    "heartbeat_silent": phrase("local rank {local_rank} sent no heartbeat[ for {silent_s:s}] "
                               "(watchdog.heartbeat_timeout)",
                               "a worker sent no heartbeat[ for {silent_s:s}] (watchdog.heartbeat_timeout)"),
    "progress_stalled": phrase("local rank {local_rank} reported the same step[ for {silent_s:s}] "
                               "(watchdog.progress_timeout)",
                               "a worker reported the same step[ for {silent_s:s}] (watchdog.progress_timeout)"),
    "readiness_callback_failed": phrase("recording a worker's readiness failed[: {exception:long}]; the watch of the "
                                        "others goes on"),
    "stacks_unavailable": phrase("could not take the stacks[ of pid {pid}] with py-spy[: {reason:long}]"),
    "stacks_write_failed": unwritten("a worker's stacks"),
    "stall": phrase("no rank[ of {ranks}] made progress[ for {still_s:s}][ (watchdog.stall_timeout: {bound_s:s})]: "
                    "a stall; its culprit is named and the attempt fails"),
    "stall_check_failed": phrase("the stall detector failed[: {exception:long}]; the job runs on without it"),
    "step_report_failed": phrase("recording a worker's step failed[: {exception:long}]; the watch goes on"),
    "flight_recorder_no_folder": phrase("no folder for the flight recorder's sockets (each rank's collective "
                                        "records)[ in {path}][: {error:long}]; hangs are named without them"),
    "flight_recorder_write_failed": unwritten("a rank's flight recorder records"),
    "timer_dir_elsewhere": phrase("the watchdog's timer FIFOs are in {path}: the run dir could not take them"
                                  "[ ({error:long})]",
                                  "the watchdog's timer FIFOs are elsewhere: the run dir could not take them"
                                  "[ ({error:long})]"),
    "timer_expired": phrase("the watchdog timer[ '{scope}'][ of local rank {local_rank}][ (pid {pid})] expired"
                            "[ {overdue_s:s} past its deadline][; sent {signal:sig}]"),
    "timer_expiry_failed": phrase("handling the expired watchdog timer[ '{scope}'][ of pid {pid}] failed"
                                  "[: {exception:long}]; the worker's exit is still seen"),
    "timer_reader_failed": phrase("reading the watchdog timer requests[ of local rank {local_rank}] failed"
                                  "[: {exception:long}]; the timer server goes on"),
    "timer_request_refused": phrase("refused a watchdog timer request[ of local rank {local_rank}][ (pid {pid})]"
                                    "[: {reason:long}][; {suppressed} more of that pid not shown]"),
    "timer_requests_rejected": phrase("rejected[ {count}] unreadable watchdog timer request(s)[ of local rank "
                                      "{local_rank}][ ({kinds})][, {total} in all][; the last: {last:long}]"),
    "timer_signal_failed": phrase("could not signal pid {pid}[ ({signal:sig})], whose watchdog timer[ '{scope}'] "
                                  "expired[: {error:long}]",
                                  "could not signal a worker whose watchdog timer[ '{scope}'] expired[: {error:long}]"),
    "timer_wake_failed": phrase("checking the watchdog timers failed[: {exception:long}]; the timer server goes on"),
    # --- workers, standbys, the guard ---
    "fork_server_lost": phrase("the fork server (it prepares warm standby workers) exited[ with code {exit_code}]; "
                               "starting another"),
    "orphans_killed": phrase("killed processes the workers left behind[ (pids {pids})][; these could not be killed: "
                             "{unkillable}]"),
    "shepherd_lost": phrase("{detail:long} (the shepherd is the guard process that kills the workers if the agent "
                            "dies)", f"{SHEPHERD} is lost"),
    "shepherd_restarted": phrase(f"{SHEPHERD} died[ of {{died_of}}]: started again[ (pid {{pid}})][, watching "
                                 "{workers} worker(s)]"),
    "standby_lost": phrase("a warm standby worker[ for local rank {local_rank}] died while waiting[ ({how})]; "
                           "preparing another"),
    "standby_not_warm": phrase("the warm standby workers were not all ready[ after {after_s:s}][ (ready: local "
                               "rank(s) {ready})][: {detail:long}]"),
    "standby_off": phrase("warm standby workers are off[: {why:long}][; {detail:long}]"),
    "stop_hurried": phrase("a second stop signal[ ({signal})]: the workers are killed now"),
    "worker_died_in_teardown": phrase(
        "rank {rank} died in its interpreter's teardown[ (exit code {exit_code})][: {detail:long}]",
        "a worker died in its interpreter's teardown[ (exit code {exit_code})][: {detail:long}]"),
    "workers_killed": phrase("rank(s) {ranks} still ran[ {after_s:s}] after the stop: killed[ with {signal}]",
                             "workers still ran[ {after_s:s}] after the stop: killed[ with {signal}]"),
    "workers_unkillable": phrase("processes left behind[: {processes}]: still alive[ {after_s:s}] after SIGKILL"
                                 "[ ({detail:long})]"),
    "worker_log_close_failed": unwritten("the end of a worker's log"),
    "worker_log_unwritable": unwritten("a worker's log", "; its output still reaches the console"),
    "worker_log_write_failed": unwritten("a worker's log", "; its output still reaches the console"),
    # --- the run's own records ---
    "failure_write_failed": unwritten("the failure's record"),
    "log_close_failed": unwritten("the end of a log file"),
    "logs_dir_unwritable": phrase("logs.dir[ {path}] cannot take this run's logs[ ({error:long})][: {detail:long}]"),
    "report_elsewhere": phrase("the run's report is at {path}: the run dir could not take it",
                               "the run's report is elsewhere: the run dir could not take it"),
    "report_write_failed": unwritten("the run's report"),
    "run_dir_unwritable": unwritten("the run dir", "; the job runs, its records may be lost"),
    "runs_index_unwritable": unwritten("the runs index", "; the job goes on, `runner runs` will not list it"),
    "spec_write_failed": unwritten("the run's spec.json"),
    "status_write_failed": unwritten("this node's status file", "; the job goes on, `runner status` may lag"),
    "transition_write_failed": unwritten(TRANSITIONS),
    "health_failed": phrase("health check failed[ (try {tries})]: {reasons:long}; giving up in {giving_up_in_s:s}",
                            "health check failed[ (try {tries})][: {reasons:long}][; trying again in {retry_in_s:s}]"),
    # --- info events shown at the normal level ---
    "graceful_stop": phrase("a graceful stop was asked: the workers finish, no restart"),
    "metrics_listening": phrase("Prometheus metrics served[ on {host}][ port {port}]"),
}

PART = re.compile(r"\[([^\[\]]*)\]")  # an optional part
SLOT = re.compile(r"\{(\w+)(?::(\w+))?\}")  # a field, with its kind
LONG = 400  # the most characters of a sentence the code wrote (a reason, a detail)


def sentence(event: str, fields: Mapping[str, object]) -> tuple[str, str] | None:
    """The event's line and its hint ('' when none), or None when the table has no entry for it. Never raises."""
    entry = PHRASES.get(event)
    if entry is None:
        return None
    fields = with_exception(fields)
    for i, template in enumerate(entry.say):
        line = fill(template, fields, last=i == len(entry.say) - 1)
        if line is not None:
            return line, fill(entry.hint, fields, last=False) or ""  # a hint missing a value is left out
    return None  # not reached: the last template always fills


def with_exception(fields: Mapping[str, object]) -> Mapping[str, object]:
    """A `log.exception` event's exception as an `exception` field: `KeyError: 'x'` (rendered while it is handled)."""
    exc = fields.get("exc_info")
    if exc is True:
        exc = sys.exc_info()[1]
    if isinstance(exc, BaseException) and "exception" not in fields:
        text = str(exc)
        return {**fields, "exception": f"{type(exc).__name__}: {text}" if text else type(exc).__name__}
    return fields


def fill(template: str, fields: Mapping[str, object], last: bool) -> str | None:
    """`template` with its slots filled; None when a plain slot has no value and `last` is false (`?` when true)."""
    out: list[str] = []
    at = 0
    for part in PART.finditer(template):
        plain = slots(template[at : part.start()], fields, last)
        if plain is None:
            return None
        out.append(plain)
        out.append(slots(part.group(1), fields, last=False) or "")
        at = part.end()
    rest = slots(template[at:], fields, last)
    return None if rest is None else "".join([*out, rest])


def slots(text: str, fields: Mapping[str, object], last: bool) -> str | None:
    """`text` with each `{field}` replaced by its words; None when one has no value, unless `last`."""
    missing = [m.group(1) for m in SLOT.finditer(text) if not present(fields.get(m.group(1)))]
    if missing and not last:
        return None
    return SLOT.sub(lambda m: word(fields.get(m.group(1)), m.group(2) or "") if present(fields.get(m.group(1)))
                    else "?", text)


def present(value: object) -> bool:
    """Whether a field has something to say: not absent, None, '' or an empty collection."""
    return value is not None and not (isinstance(value, str | list | tuple | dict | set | frozenset) and not value)


def word(value: object, kind: str = "") -> str:  # noqa: PLR0911 - one line per kind of value
    """A field's value in words, on one line, cut to a readable length (see the module's docstring)."""
    if kind == "s" and isinstance(value, int | float) and not isinstance(value, bool):
        return f"{short(value)} s"
    if kind == "sig" and isinstance(value, int) and not isinstance(value, bool):
        return signal_name(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return names(value)
    if isinstance(value, set | frozenset):
        return names(sorted(value, key=text_of))
    if isinstance(value, Mapping):
        items = [f"{short(k)}: {short(v)}" for k, v in list(value.items())[:6]]
        return ", ".join(items) + (f", +{len(value) - 6}" if len(value) > 6 else "")
    if isinstance(value, float):
        return short(value)
    if kind == "long":
        text = printable(text_of(value))
        return text if len(text) <= LONG else text[: LONG - 3] + "..."
    return short(text_of(value))


def signal_name(number: int) -> str:
    """`SIGKILL` for 9, `no signal` for 0, `signal 99` for a number that names none."""
    if number == 0:
        return "no signal"
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def names(value: object, most: int = 6) -> str:
    """A list field as `a, b, c, +4`, at most `most` items written out; '' when it is not a non-empty list."""
    if not isinstance(value, list | tuple) or not value:
        return ""
    shown = ", ".join(short(v) for v in value[:most])
    return shown + (f", +{len(value) - most}" if len(value) > most else "")


def short(value: object) -> str:
    """A field value in a few characters: lists joined, floats rounded, long strings cut."""
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e6 else f"{value:.0f}"
    if isinstance(value, list | tuple):
        return ",".join(short(v) for v in value)
    text = printable(text_of(value))
    return text if len(text) <= 120 else text[:117] + "..."


def text_of(value: object) -> str:
    """str(value), or its type's name when that fails (an int of more than 4300 digits, a broken __str__)."""
    try:
        return str(value)
    except Exception:  # a value may be anything: its words must never stop the console
        return f"<{type(value).__name__}>"


def printable(text: str) -> str:
    r"""`text` on one readable console line: its lines joined with ' / ', tabs as spaces, other controls escaped.

    A multi-line value (py-spy's `Error: ...\n\nCaused by: ...`) reads as words, never as a literal `\n`; an escape
    sequence or a NUL in a value (a node id may be any text) is shown escaped, never sent to the terminal.
    """
    if text.isprintable():
        return text
    if any(ch in LINE_BREAKS for ch in text):
        text = " / ".join(line.strip() for line in text.splitlines() if line.strip())
    text = text.replace("\t", " ")
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")  # what str.splitlines() splits on
