"""The `runner` command: one module per subcommand; `commands` is the one list of their names."""
