"""`python -m qwen_tui`: the same as the `qwen-tui` command."""

import sys

from qwen_tui.cli.main import main

if __name__ == "__main__":  # importing the module (pkgutil.walk_packages) must not start the app
    sys.exit(main())
