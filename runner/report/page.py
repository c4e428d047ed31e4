"""The run as one self-contained HTML page: inline CSS and SVG, no script, nothing fetched from a network."""

from __future__ import annotations

import html
import time

from runner.report.ledger_page import ledger_section
from runner.report.story import NodeStory, Story
from runner.rundir.records import FailureRecord

WIDTH = 1180  # px of the timeline
CHAR_PX = 7  # px an 11px system-ui character takes at most (digits, "+", "s"): to keep a label inside the SVG
LABEL = 170  # px of the row labels
ROW = 22  # px per row
STATE_COLORS = {
    "INIT": "#c9ced6", "RENDEZVOUS": "#7aa7e0", "RUNNING": "#5cb85c", "FAILED": "#d9534f",
    "RESTARTING": "#f0ad4e", "SHUTDOWN": "#6c757d",
}
WORKER_COLORS = {"ok": "#5cb85c", "failed": "#d9534f", "stopped": "#9aa3ad"}
OUTCOME_COLORS = {"succeeded": "#2e7d32", "failed": "#c62828", "error": "#c62828", "stopped": "#ef6c00"}
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1d232a;background:#fafbfc}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px}
.meta{color:#5a6470}.meta code{font-size:12px}
.badge{display:inline-block;padding:1px 10px;border-radius:10px;color:#fff;font-weight:600;font-size:13px}
.cause{border-left:4px solid #c62828;background:#fff;padding:10px 14px;margin:14px 0;box-shadow:0 1px 2px #0001}
.cause.recovered{border-color:#ef6c00}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px #0001}
th,td{padding:4px 10px;border-bottom:1px solid #e5e8eb;text-align:left;vertical-align:top}
th{background:#f0f2f4;font-weight:600}
pre{background:#1f2428;color:#e1e4e8;padding:10px;overflow:auto;max-height:420px;font-size:12px;border-radius:4px}
details{margin:6px 0} summary{cursor:pointer;font-weight:600}
.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px;border-radius:2px}
svg text{font:11px system-ui,sans-serif} svg .lbl{fill:#1d232a} svg .in{fill:#fff}
"""


def esc(value: object) -> str:
    """Text for HTML, escaped."""
    return html.escape(str(value), quote=True)


def seconds(value: float | None) -> str:
    """'1.25 s', '-' when unknown."""
    return "-" if value is None else f"{value:.2f} s"


def clock(epoch: float) -> str:
    """Local date and time of `epoch`."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def render(story: Story) -> str:
    """The whole page."""
    outcome = story.outcome()
    color = OUTCOME_COLORS.get(outcome, "#6c757d")
    # The job's attempts and restarts, not each node's: every node of an etcd job runs attempt k (and sees the
    # restart after it) together, so attempt k of two nodes is one attempt.
    attempts = len({k for n in story.nodes for k, *_ in n.attempts()})
    restarts = {r.attempt for n in story.nodes for r in n.restarts()}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>runner report: {esc(story.job)}</title><style>{CSS}</style></head><body>",
        f'<h1>{esc(story.job)} <span class="badge" id="outcome" style="background:{color}">{esc(outcome)}</span></h1>',
        (f'<div class="meta">started {esc(clock(story.start))} · {esc(seconds(story.end - story.start))} · '
         f'{len(story.nodes)} node(s) · <span id="attempt-count">{attempts}</span> attempt(s) · '
         f"{len(restarts)} restart(s)</div>"),
        '<div class="meta">' + "<br>".join(f"{esc(n.node)}: <code>{esc(n.run_dir)}</code>" for n in story.nodes)
        + "</div>",
        root_cause(story, outcome),
        "<h2>Timeline</h2>",
        legend(),
        timeline(story),
        *(["<h2>Replica groups</h2>", groups_table(story)] if story.groups else []),
        "<h2>Attempts</h2>",
        attempts_table(story),
        "<h2>Restarts</h2>",
        restarts_table(story),
        "<h2>Time ledger (ETTR)</h2>",  # docs/goodput.md
        ledger_section(story),
        "<h2>Failures</h2>",
        failures_section(story),
        "<h2>Transitions</h2>",
        transitions_section(story),
        "</body></html>",
    ]
    return "\n".join(parts)


def root_cause(story: Story, outcome: str) -> str:
    """The box a reader sees first: the failure that explains the run."""
    found = story.root_cause()
    if found is None:
        return '<div class="cause recovered" id="root-cause">No failure recorded.</div>'
    node, f = found
    recovered = outcome == "succeeded"
    title = "Recovered from" if recovered else "Root cause"
    lines = [f"<b>{title}</b> (node {esc(node)}, attempt {esc(f.attempt)}): {esc(f.reason)}"]
    lines += [f"{key}: {esc(value)}" for key, value in (("detected", f.detected), ("culprit_note", f.culprit_note),
                                                        ("error", f.error), ("hint", f.hint)) if value]
    if f.log_dir:
        lines.append(f"logs: <code>{esc(f.log_dir)}</code>")
    cls = "cause recovered" if recovered else "cause"
    return f'<div class="{cls}" id="root-cause">' + "<br>".join(lines) + "</div>"


def legend() -> str:
    """Colour keys of the timeline."""
    items = [f'<span><i style="background:{c}"></i>{esc(s)}</span>' for s, c in STATE_COLORS.items()]
    items += [f'<span><i style="background:{c}"></i>worker {esc(h)}</span>' for h, c in WORKER_COLORS.items()]
    return '<div class="legend">' + "".join(items) + "</div>"


def timeline(story: Story) -> str:
    """One SVG: per node a band of states, then one row per local rank with each worker's life."""
    t0, t1 = story.start, max(story.end, story.start + 1e-3)
    scale = (WIDTH - LABEL - 10) / (t1 - t0)

    def x(t: float) -> float:
        return LABEL + (t - t0) * scale

    rows: list[str] = []
    y = 24
    for node in story.nodes:
        rows.append(f'<text class="lbl" x="4" y="{y + 15}" font-weight="bold">node {esc(node.node)}</text>')
        for seg in node.segments():
            seg_w = max(1.5, (seg.end - seg.start) * scale)
            tip = f"{seg.state} · attempt {seg.attempt} · {seconds(seg.end - seg.start)} from {clock(seg.start)}"
            rows.append(f'<rect class="state" data-state="{esc(seg.state)}" x="{x(seg.start):.1f}" y="{y}" '
                        f'width="{seg_w:.1f}" height="{ROW - 4}" fill="{STATE_COLORS.get(seg.state, "#999")}">'
                        f"<title>{esc(tip)}</title></rect>")
            if seg_w > 8 * len(seg.state):
                rows.append(f'<text class="in" x="{x(seg.start) + 4:.1f}" y="{y + 13}">{esc(seg.state)}</text>')
        y += ROW
        for local_rank in sorted({w.local_rank for w in node.workers}):
            rows.append(f'<text class="lbl" x="14" y="{y + 13}">local rank {local_rank}</text>')
            for w in (w for w in node.workers if w.local_rank == local_rank):
                end = w.end if w.end is not None else story.end
                width = max(1.5, (end - w.start) * scale)
                how = w.how if w.exit_code is not None else "stopped"
                ended = f"exit {w.exit_code}" if w.exit_code is not None else "stopped by the runner"
                tip = f"rank {w.rank} · pid {w.pid} · attempt {w.attempt} · {ended} · {seconds(end - w.start)}"
                rows.append(f'<rect class="worker" data-rank="{w.rank}" data-attempt="{w.attempt}" '
                            f'data-how="{how}" x="{x(w.start):.1f}" y="{y + 2}" width="{width:.1f}" '
                            f'height="{ROW - 8}" rx="3" fill="{WORKER_COLORS[how]}"><title>{esc(tip)}</title></rect>')
                label = f"rank {w.rank} · a{w.attempt}" + (f" · exit {w.exit_code}" if how == "failed" else "")
                if width > 6.5 * len(label):
                    rows.append(f'<text class="in" x="{x(w.start) + 4:.1f}" y="{y + 13}">{esc(label)}</text>')
            y += ROW
        rows += [f'<line x1="{x(r.at):.1f}" x2="{x(r.at):.1f}" y1="20" y2="{y}" stroke="#c62828" '
                 f'stroke-dasharray="3,3"><title>{esc(f"attempt {r.attempt} ended: {r.cause}")}</title></line>'
                 for r in node.restarts()]
        y += 8
    axis = []
    span = t1 - t0
    step = nice_step(span)
    tick = 0.0
    while tick <= span + 1e-9:
        at = x(t0 + tick)
        text = f"+{tick:g} s"
        # A label that would run past the right edge ends at its tick instead (the last one was clipped).
        place = (f'x="{at - 2:.1f}" text-anchor="end"' if at + 2 + CHAR_PX * len(text) > WIDTH
                 else f'x="{at + 2:.1f}"')
        axis.append(f'<line x1="{at:.1f}" x2="{at:.1f}" y1="14" y2="{y}" stroke="#0001"/>'
                    f'<text class="lbl" {place} y="11">{text}</text>')
        tick += step
    return (f'<svg id="timeline" width="{WIDTH}" height="{y + 4}" viewBox="0 0 {WIDTH} {y + 4}" role="img" '
            f'aria-label="timeline of the run">' + "".join(axis + rows) + "</svg>")


def nice_step(span: float) -> float:
    """A round tick spacing giving 5 to 12 ticks over `span` seconds."""
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400):
        if span / step <= 12:
            return float(step)
    return span / 10


def groups_table(story: Story) -> str:
    """Each replica group: outcome, attempts, restarts, the step it committed last, and its steps over time."""
    rows = [('<table id="groups"><tr><th>group</th><th>outcome</th><th>attempts</th><th>restarts</th>'
             "<th>last committed step</th><th>steps over time</th></tr>")]
    for g in story.groups:
        steps = g.get("steps")
        samples = [(float(s[0]), s[1]) for s in (steps if isinstance(steps, list) else [])
                   if isinstance(s, list) and len(s) == 2 and isinstance(s[0], int | float)]
        shown = samples[:: max(1, len(samples) // 12)]  # a dozen points: enough to see who stepped on
        timeline = ", ".join(f"+{t - story.start:.0f}s: {s}" for t, s in shown) or "-"
        rows.append(f'<tr class="group-row"><td>{esc(g.get("group"))}</td><td>{esc(g.get("outcome"))}</td>'
                    f'<td>{esc(g.get("attempts"))}</td><td>{esc(g.get("restarts"))}</td>'
                    f'<td>{esc(g.get("step"))}</td><td>{esc(timeline)}</td></tr>')
    return "\n".join([*rows, "</table>"])


def attempts_table(story: Story) -> str:
    """node, attempt, start, duration, how it ended."""
    rows = [('<table id="attempts"><tr><th>node</th><th>attempt</th><th>start</th><th>duration</th>'
             "<th>workers</th><th>ended by</th></tr>")]
    for node in story.nodes:
        for k, start, end, how in node.attempts():
            workers = [w for w in node.workers if w.attempt == k]
            summary = ", ".join(f"rank {w.rank} pid {w.pid} {w.how}" for w in workers) or "-"
            rows.append(f'<tr class="attempt-row" data-node="{esc(node.node)}" data-attempt="{k}"><td>'
                        f"{esc(node.node)}</td><td>attempt {k}</td><td>+{start - story.start:.2f} s</td>"
                        f"<td>{esc(seconds(end - start))}</td><td>{esc(summary)}</td><td>{esc(how)}</td></tr>")
    return "\n".join([*rows, "</table>"])


def restarts_table(story: Story) -> str:
    """Each restart: which attempt ended, why, and how long until workers ran again."""
    restarts = [r for n in story.nodes for r in n.restarts()]
    if not restarts:
        return "<p>None.</p>"
    rows = [('<table id="restarts"><tr><th>node</th><th>after attempt</th><th>trigger</th><th>cause</th>'
             "<th>recovery (to RUNNING)</th><th>to all workers running</th><th>to all workers ready</th></tr>")]
    rows += [f'<tr class="restart-row"><td>{esc(r.node)}</td><td>{r.attempt}</td><td>{esc(r.trigger)}</td>'
             f"<td>{esc(r.cause)}</td><td>{esc(seconds(r.recovery_s))}</td>"
             f"<td>{esc(seconds(r.measured_s('running')))}</td><td>{esc(seconds(r.measured_s('ready')))}</td></tr>"
             for r in restarts]
    return "\n".join([*rows, "</table>"])


def failures_section(story: Story) -> str:
    """Every failure with what was captured: error, traceback or stderr tail, stacks of a hung worker."""
    blocks = [failure_block(node, f) for node in story.nodes for f in node.failures]
    return "\n".join(blocks) or "<p>None.</p>"


def hang_lines(hang: object) -> list[str]:
    """A hang's culprit as the flight recorders showed it (docs/hangs.md): who held up whom, in which call."""
    if not isinstance(hang, dict):
        return []

    def ranks_of(ranks: object) -> str:
        return ", ".join(f"rank {r.get('rank')} (node {r.get('node')})" for r in ranks if isinstance(r, dict)) \
            if isinstance(ranks, list) else ""

    def who(key: str) -> str:
        return ranks_of(hang.get(key))

    cycle = hang.get("cycle")
    circular = "; ".join(  # a circular wait: where each of its ranks waits
        f"{ranks_of(c.get('ranks'))} in {c.get('collective')} #{c.get('collective_seq')} (process group "
        f"{c.get('process_group')})" for c in cycle if isinstance(c, dict)) if isinstance(cycle, list) else ""
    call = f"{hang.get('collective')} #{hang.get('collective_seq')}" if hang.get("collective") and not circular else ""
    items = [("finding", hang.get("finding")), ("culprit", who("culprits")), ("circular wait", circular),
             ("waiting", who("waiting")),
             ("collective", call), ("called instead", str(hang.get("odd_call") or "")), ("died of it", who("died")),
             ("waited", f"{hang.get('waited_s')} s" if hang.get("waited_s") is not None else ""),
             ("ranks not read", ", ".join(map(str, hang.get("ranks_unread") or [])))]
    return [f'<div class="hang">{esc(k)}: {esc(v)}</div>' for k, v in items if v]


def failure_block(node: NodeStory, f: FailureRecord) -> str:
    """One failure."""
    head = f"node {node.node} · attempt {f.attempt} · {f.kind or '?'}: {f.reason}"
    parts = [f'<details class="failure" data-attempt="{esc(f.attempt)}" open><summary>{esc(head)}</summary>']
    parts += [f"<div>{esc(key)}: {esc(value)}</div>" for key, value in (
        ("detected", f.detected), ("culprit_note", f.culprit_note), ("error", f.error), ("hint", f.hint),
        ("log_dir", f.log_dir)) if value]
    parts += hang_lines(f.hang)
    for value, label in ((f.traceback, "traceback"), (f.stderr_tail, "last lines of stderr"),
                         (f.stacks, "stacks before the kill")):
        if value:
            parts.append(f"<div>{label}:</div><pre>{esc(value)}</pre>")
    parts.append("</details>")
    return "".join(parts)


def transitions_section(story: Story) -> str:
    """Every transition of every node, folded."""
    rows = [('<details><summary>all transitions</summary><table id="transitions"><tr><th>node</th><th>time</th>'
             "<th>from</th><th>to</th><th>trigger</th><th>attempt</th><th>reason</th></tr>")]
    for node in story.nodes:
        rows += [f"<tr><td>{esc(node.node)}</td><td>+{t.time - story.start:.3f} s</td><td>{esc(t.src)}</td>"
                 f"<td>{esc(t.dst)}</td><td>{esc(t.trigger)}</td><td>{t.attempt}</td><td>{esc(t.reason)}</td></tr>"
                 for t in node.transitions]
    return "\n".join([*rows, "</table></details>"])
