"""The command line's exit codes, one meaning each (docs/cli.md)."""

EXIT_FAILED = 1  # an upstream or a tool failed (or a probed upstream is not ready)
EXIT_USAGE = 2  # a mistake in the command or the config
