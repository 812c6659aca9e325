"""Where the tests find the repository's files."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "presets" / "local-demo.yaml"
FIXTURES = ROOT / "tests" / "fixtures"
