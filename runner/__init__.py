"""runner: run distributed PyTorch jobs from a declarative YAML spec."""

__version__ = "0.1.0"
