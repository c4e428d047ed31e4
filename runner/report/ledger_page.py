"""The `runner report` page's time ledger: ETTR, and where each failure's time went (docs/goodput.md).

Read from each node's report.json `ledger` (and, for replica groups, each group's and the job's); a report without
one (an older runner) shows a line saying so.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from runner.json_types import JSONObject
from runner.observe.ledger import LAUNCH_PHASES, PHASES

if TYPE_CHECKING:
    from runner.report.story import Story


def ledger_section(story: Story) -> str:
    """One summary row per ledger (node, group, job), then one row per failure with its phases."""
    ledgers: list[tuple[str, JSONObject]] = [
        (f"{node.node} (job)" if story.groups else node.node, own)
        for node in story.nodes if (own := node.report.ledger) is not None]
    ledgers += [(f"group {g.get('group')}", ledger)
                for g in story.groups if isinstance(ledger := g.get("ledger"), dict)]
    if not ledgers:
        return "<p>No ledger in report.json (a run by an older runner, or one still running).</p>"
    rows = [('<table id="ledger"><tr><th>run</th><th>ETTR</th><th>wall</th><th>productive</th><th>launch</th>'
             "<th>lost to failures</th><th>failures</th><th>basis</th></tr>")]
    rows += [f'<tr class="ledger-row"><td>{esc(name)}</td><td class="ettr">{esc(ratio(d.get("ettr")))}</td>'
             f'<td>{secs(d.get("wall_s"))}</td><td>{secs(d.get("productive_s"))}</td><td>{secs(d.get("launch_s"))}'
             f'{phases(d.get("launch"), LAUNCH_PHASES)}</td><td>{secs(d.get("lost_s"))}</td>'
             f'<td>{esc(d.get("failure_count", "-"))}</td><td>{esc(d.get("basis", "-"))}</td></tr>'
             for name, d in ledgers]
    rows.append("</table>")
    failures = [(name, f) for name, d in ledgers for f in listed(d.get("failures")) if isinstance(f, dict)]
    if failures:
        rows.append('<table id="ledger-failures"><tr><th>run</th><th>after</th><th>class</th><th>lost</th>'
                    "<th>phases</th><th>last step</th><th>checkpoint</th><th>resumed from</th>"
                    "<th>steps lost</th></tr>")
        rows += [f'<tr class="ledger-failure"><td>{esc(name)}</td><td>{esc(f.get("trigger"))}</td>'
                 f'<td>{esc(f.get("failure_class") or "-")}</td><td>{secs(f.get("lost_s"))}</td>'
                 f'<td>{phases(f.get("phases"), PHASES)}</td><td>{esc(dash(f.get("last_step")))}</td>'
                 f'<td>{esc(dash(f.get("checkpoint")))}</td><td>{esc(dash(f.get("resumed_from")))}</td>'
                 f'<td>{esc(dash(f.get("steps_lost")))}</td></tr>' for name, f in failures]
        rows.append("</table>")
    return "\n".join(rows)


def listed(value: object) -> list[object]:
    """`value` if it is a list, else none (report.json is read as it comes)."""
    return list(value) if isinstance(value, list) else []


def phases(values: object, names: tuple[str, ...]) -> str:
    """`detection 2.41 s · teardown 0.00 s · ...`: the phases that took any time, smallest print."""
    if not isinstance(values, dict):
        return ""
    shown = [f"{n.replace('_', ' ')} {float(values[n]):.2f} s" for n in names
             if isinstance(values.get(n), (int, float)) and values[n] > 0]
    return f'<div class="phases">{esc(" · ".join(shown))}</div>' if shown else ""


def ratio(value: object) -> str:
    """An ETTR to two decimals, '?' when unknown."""
    return f"{value:.2f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "?"


def secs(value: object) -> str:
    """Seconds to two decimals, escaped; '-' when absent."""
    return esc(f"{value:.2f} s") if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def dash(value: object) -> object:
    """The value, or '-' for None."""
    return "-" if value is None else value


def esc(value: object) -> str:
    """HTML-escaped text."""
    return html.escape(str(value))
