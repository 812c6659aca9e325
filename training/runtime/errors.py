"""The one exception type that means "the user's input is wrong" (exit code 2)."""


class InputError(Exception):
    """Bad input or configuration, found before training starts.

    The message is one line that names the file, the record (index and id) or
    the flag, and what is wrong; finetune.main prints it and exits with 2.
    """


class ExplainedFailure(Exception):
    """A failure during training that the worker found itself and explains in one line (FP8's loss leaving bf16's
    under --fp8 on): finetune.main prints it without a traceback and exits with 1."""


EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def report_failure(error: Exception) -> int:
    """The end of a worker tool's main (datapreview, merge, chat) on an exception: its exit code, and on stderr one
    `error: ...` line for the caller (qwen_tui.run.tools.json_tool shows it), after the traceback where the failure is
    not the user's input."""
    import sys

    if isinstance(error, InputError):
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    import traceback

    traceback.print_exception(error)
    print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
    return EXIT_FAILED
