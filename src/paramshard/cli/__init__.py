"""The `paramshard` command line: main.py dispatches, one module per subcommand.
(The CLI is where printing to the terminal belongs; the library logs.)"""
from paramshard.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
