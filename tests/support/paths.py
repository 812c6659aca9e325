"""Where the tests find the repository's files."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "presets" / "local-demo.yaml"
# The demo's DPO stage: its own port in the tests (a copy on a free port), so its users need not take turns
DEMO_DPO = ROOT / "presets" / "local-demo-dpo.yaml"
FIXTURES = ROOT / "tests" / "fixtures"
