"""Job specs: load a YAML file into a validated, frozen JobSpec (see schemas/job.schema.json)."""

from runner.config.loader import load_spec, load_spec_text
from runner.config.redact import redact
from runner.config.spec import JobSpec

__all__ = ["JobSpec", "load_spec", "load_spec_text", "redact"]
