"""One module per `paramshard` subcommand (see paramshard.cli.COMMANDS)."""
