"""`python -m runner` is the same as the `runner` console script."""

from runner.cli import main

raise SystemExit(main())
