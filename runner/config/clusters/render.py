"""The dispatcher of `runner template`: one renderer per cluster kind (common.py is what both renderers share)."""

from __future__ import annotations

from runner.config.spec import JobSpec


def render(kind: str, spec: JobSpec, spec_path: str, spec_text: str) -> str:
    """The template of `kind` for `spec`, loaded from `spec_path` (kept as given: the script refers to it)."""
    if kind == "slurm":
        from runner.config.clusters.slurm import sbatch_script

        return sbatch_script(spec, spec_path)
    from runner.config.clusters.kubernetes import manifests

    return manifests(spec, spec_path, spec_text)


def render_file(kind: str, spec_path: str) -> str:
    """`runner template KIND SPEC`: the spec loaded as the nodes will, checked, rendered.

    What cannot work once the nodes are separate machines (runner/config/cluster_checks.py) is a SpecError (exit 2).
    """
    from runner.config.cluster_checks import template_problems
    from runner.config.clusters.common import load_for_template
    from runner.errors import SpecError

    spec, doc, text = load_for_template(spec_path)
    problems = template_problems(kind, spec, doc)
    if problems:
        raise SpecError(spec_path, problems)
    return render(kind, spec, spec_path, text)
