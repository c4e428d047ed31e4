"""Read a Prometheus scrape with prometheus_client's own parser (never matched as text), for the metrics tests."""

from __future__ import annotations

import re


def value(text: str, series: str) -> float | None:
    """The value of one series, e.g. 'runner_attempt' or 'runner_state{runner_state="RUNNING"}' (exactly those labels).

    The scrape is read with prometheus_client's own parser, not matched as text: how a release of it writes label
    order, quoting or numbers is its business; the names, labels and values are ours.
    """
    from prometheus_client.parser import text_string_to_metric_families

    name, _, rest = series.partition("{")
    labels = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    found = [sample.value for family in text_string_to_metric_families(text) for sample in family.samples
             if sample.name == name and sample.labels == labels]
    assert len(found) <= 1, (series, found)
    return found[0] if found else None


def has_series(text: str, name: str, **labels: str) -> bool:
    """A sample `name` whose labels include `labels` (others may be there too)."""
    from prometheus_client.parser import text_string_to_metric_families

    return any(sample.name == name and labels.items() <= sample.labels.items()
               for family in text_string_to_metric_families(text) for sample in family.samples)
