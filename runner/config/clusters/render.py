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
