"""The dispatcher of `runner template`: one renderer per cluster kind (common.py is what both renderers share)."""

from __future__ import annotations

from runner.config.clusters.fit import Fit
from runner.config.spec import JobSpec


def render(kind: str, spec: JobSpec, spec_path: str, spec_text: str, fitted: Fit | None = None) -> str:
    """The template of `kind` for `spec`, loaded from `spec_path` (kept as given: the script refers to it).

    `fitted`: what the template changes (fit.py); None: worked out from `spec` alone.
    """
    if kind == "slurm":
        from runner.config.clusters.slurm import sbatch_script

        return sbatch_script(spec, spec_path, fitted)
    from runner.config.clusters.kubernetes import manifests

    return manifests(spec, spec_path, spec_text, fitted)


def render_file(kind: str, spec_path: str, notes: list[str] | None = None) -> str:
    """`runner template KIND SPEC`: the spec loaded as the nodes will, checked, rendered.

    What cannot work once the nodes are separate machines (runner/config/cluster_checks.py) is a SpecError (exit 2);
    what the template changes so that the job runs on the allocation (fit.py) is added to `notes` (the CLI prints
    them on stderr).
    """
    from runner.config.cluster_checks import template_problems
    from runner.config.clusters.common import check_etcd, load_for_template
    from runner.config.clusters.fit import fit
    from runner.errors import SpecError

    spec, doc, text = load_for_template(spec_path)
    problems = template_problems(kind, spec, doc)  # every refusal at once: a user fixes them in one go
    try:
        check_etcd(spec, spec_path)
    except SpecError as e:
        problems += e.problems
    first = None
    if kind == "kubernetes":
        from runner.config.clusters.kubernetes import first_node

        first = first_node(spec)
    try:
        fitted = fit(kind, spec, doc, spec_path, first)
    except SpecError as e:
        problems += e.problems
    if problems:
        raise SpecError(spec_path, problems)
    if notes is not None:
        notes.extend(fitted.notes)
    return render(kind, spec, spec_path, text, fitted)
