"""The one exception type that means "the user's input is wrong" (exit code 2)."""


class InputError(Exception):
    """Bad input or configuration, found before training starts.

    The message is one line that names the file, the record (index and id) or
    the flag, and what is wrong; finetune.main prints it and exits with 2.
    """


EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
