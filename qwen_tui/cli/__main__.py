"""`python -m qwen_tui.cli`: the same as the `qwen-tui` command."""

import sys

from qwen_tui.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
