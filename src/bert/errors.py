"""The one exception type for bad user input.

The CLI prints its message on one line (no traceback) and exits with code 2, so every message must
name the file, line or field at fault and say how to fix it.
"""


class InputError(Exception):
    """Bad input from the user: a flag, a file, a config or a checkpoint that cannot be used as given."""


class NonFiniteError(InputError):
    """A training run met a loss, a gradient norm or weights that are not finite numbers (NaN or inf).

    An `InputError`, so the CLI reports it in one line: its cause is the run's flags or data (a learning
    rate that diverges, a broken batch), and the message names the step and the way out.
    """
