"""The `podguard` command line (Typer). Every option also reads PODGUARD_<OPTION> from the environment."""
