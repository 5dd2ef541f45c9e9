"""specgen's command line (Typer): one module per command; import it only as `cli.main`."""

from cli._process import open_closed_streams

open_closed_streams()  # first: the command modules read sys.stdout and sys.stderr as they are imported
