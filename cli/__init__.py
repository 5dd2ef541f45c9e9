"""specgen's command line (Typer): one module per command; import it only as `cli.main`."""
