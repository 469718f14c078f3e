"""Command-line interface: one module per subcommand, imported only when used."""
