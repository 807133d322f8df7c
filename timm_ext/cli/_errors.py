"""The one exception the command line turns into a one-line message and an exit code."""


class CliError(Exception):
    """Bad input or a missing resource, reported as one line (no traceback) with exit code 2."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
