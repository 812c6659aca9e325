"""Only what pyproject.toml cannot say: the shipped presets live at the top of the repository (presets/, where
users and the docs look for them) and are copied into the package (qwen_tui/presets) when a wheel is built, so
an installed qwen-tui finds `qwen-tui demo`'s preset. The metadata is all in pyproject.toml."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithPresets(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads ROOT/presets itself (qwen_tui.preset.shipped)
        target = Path(self.build_lib) / "qwen_tui" / "presets"
        self.mkpath(str(target))
        for preset in sorted((ROOT / "presets").glob("*.yaml")):
            self.copy_file(str(preset), str(target / preset.name))


setup(cmdclass={"build_py": BuildPyWithPresets})
