"""Subcommands of the `meshplan` CLI; each module exposes `register(subparsers)`."""
