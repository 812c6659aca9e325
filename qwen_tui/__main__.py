"""`python -m qwen_tui`: the same as the `qwen-tui` command."""

import sys

from qwen_tui.cli import main

sys.exit(main())
