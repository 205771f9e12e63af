"""The ``ges`` command line: thin typer commands that parse, call into ``ges``, render with rich."""
