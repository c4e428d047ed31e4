"""The `runner report` page's time ledger: ETTR, and where each failure's time went (docs/goodput.md).

Read from each node's report.json `ledger` (and, for replica groups, each group's and the job's); a report without
one (an older runner) shows a line saying so.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from runner.observe.ledger import LAUNCH_PHASES, PHASES
from runner.rundir.records import LedgerRecord

if TYPE_CHECKING:
    from runner.report.story import Story


def ledger_section(story: Story) -> str:
    """One summary row per ledger (node, group, job), then one row per failure with its phases."""
    ledgers: list[tuple[str, LedgerRecord]] = [
        (f"{node.node} (job)" if story.groups else node.node, own)
        for node in story.nodes if (own := node.report.ledger) is not None]
    ledgers += [(f"group {g.get('group')}", LedgerRecord.from_dict(ledger))
                for g in story.groups if isinstance(ledger := g.get("ledger"), dict)]
    if not ledgers:
        return "<p>No ledger in report.json (a run by an older runner, or one still running).</p>"
    rows = [('<table id="ledger"><tr><th>run</th><th>ETTR</th><th>wall</th><th>productive</th><th>launch</th>'
             "<th>lost to failures</th><th>failures</th><th>basis</th></tr>")]
    rows += [f'<tr class="ledger-row"><td>{esc(name)}</td><td class="ettr">{esc(ratio(d.ettr))}</td>'
             f"<td>{secs(d.wall_s)}</td><td>{secs(d.productive_s)}</td><td>{secs(d.launch_s)}"
             f"{phases(d.launch, LAUNCH_PHASES)}</td><td>{secs(d.lost_s)}</td>"
             f'<td>{esc(dash(d.failure_count))}</td><td>{esc(d.basis or "-")}</td></tr>'
             for name, d in ledgers]
    rows.append("</table>")
    failures = [(name, f) for name, d in ledgers for f in d.failures or ()]
    if failures:
        rows.append('<table id="ledger-failures"><tr><th>run</th><th>after</th><th>class</th><th>lost</th>'
                    "<th>phases</th><th>last step</th><th>checkpoint</th><th>resumed from</th>"
                    "<th>steps lost</th></tr>")
        rows += [f'<tr class="ledger-failure"><td>{esc(name)}</td><td>{esc(f.trigger)}</td>'
                 f'<td>{esc(f.failure_class or "-")}</td><td>{secs(f.lost_s)}</td>'
                 f"<td>{phases(f.phases, PHASES)}</td><td>{esc(dash(f.last_step))}</td>"
                 f"<td>{esc(dash(f.checkpoint))}</td><td>{esc(dash(f.resumed_from))}</td>"
                 f"<td>{esc(dash(f.steps_lost))}</td></tr>" for name, f in failures]
        rows.append("</table>")
    return "\n".join(rows)


def phases(values: dict[str, float] | None, names: tuple[str, ...]) -> str:
    """`detection 2.41 s · teardown 0.00 s · ...`: the phases that took any time, smallest print."""
    if values is None:
        return ""
    shown = [f"{n.replace('_', ' ')} {values[n]:.2f} s" for n in names if values.get(n, 0.0) > 0]
    return f'<div class="phases">{esc(" · ".join(shown))}</div>' if shown else ""


def ratio(value: float | None) -> str:
    """An ETTR to two decimals, '?' when unknown."""
    return "?" if value is None else f"{value:.2f}"


def secs(value: float | None) -> str:
    """Seconds to two decimals, escaped; '-' when absent."""
    return "-" if value is None else esc(f"{value:.2f} s")


def dash(value: object) -> object:
    """The value, or '-' for None."""
    return "-" if value is None else value


def esc(value: object) -> str:
    """HTML-escaped text."""
    return html.escape(str(value))
