"""`python -m runner` is the same as the `runner` console script."""

from runner.cli.main import main

raise SystemExit(main())
