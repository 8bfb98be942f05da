"""The `mindvl` command line. main.py builds the parser and dispatches; every other module but options.py is
one command group with the same interface, `register(commands)`, which adds its parser(s) and sets their
`func`. A new subcommand goes into its group's module; a new group is a new module named in main.COMMAND_GROUPS.
"""
from mindvl.cli.main import main

__all__ = ["main"]
