"""MkDocs hooks (mkdocs.yml names this file): what the manual takes from the rest of the repository.

- A page that says `<!-- generated: NAME -->` gets that section of the reference, rendered from the code at build
  time (docs/gen_reference.py), so the reference is never a copy that can fall behind.
- The repository's files the pages link to (tests, benchmarks and their results, presets, the code) are added to
  the site under repo/, so that a link written for a reader of the checkout (`../tests/unit/test_x.py`) works in the
  site too, and `mkdocs build --strict` fails when its target is gone.
- CHANGELOG.md and CONTRIBUTING.md, at the repository's root, become pages of the site, and so do the folders'
  READMEs; their links into docs/ are turned into links within the site.
"""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import gen_reference  # noqa: E402  (beside this file, found through the path set just above)

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")
# What of the repository a page may link to: (folder, glob). Links to anything else outside docs/ fail the build.
LINKABLE = [("tests", "**/*.py"), ("tests", "**/*.md"), ("bench", "*.py"), ("bench", "README.md"),
            ("bench/results", "**/*"), ("presets", "*.yaml"), ("qwen_tui", "**/*.py"), ("training", "**/*.py"),
            (".", "pyproject.toml"), (".ci", "run"), (".", "CHANGELOG.md"), (".", "CONTRIBUTING.md"),
            (".", "README.md"), ("screenshots", "*.png"), ("docs", "*.py")]
ROOT_PAGES = {"CHANGELOG.md": "changelog", "CONTRIBUTING.md": "contributing"}


def on_files(files: Files, config, **kwargs) -> Files:
    for folder, pattern in LINKABLE:
        for path in sorted((ROOT / folder).glob(pattern)):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT).as_posix()
            # src_uri "../x" is how a page in docs/ names the repository's x; it lands in the site as repo/x
            f = File.generated(config, f"../{rel}", abs_src_path=str(path), inclusion=InclusionLevel.INCLUDED)
            if rel in ROOT_PAGES:
                f.dest_uri, f.url = f"{ROOT_PAGES[rel]}/index.html", f"{ROOT_PAGES[rel]}/"
            elif f.is_documentation_page():  # a folder's README: a page of its own, as the checkout shows it
                f.dest_uri, f.url = f"repo/{rel.removesuffix('.md')}/index.html", f"repo/{rel.removesuffix('.md')}/"
            else:
                f.dest_uri = f.url = f"repo/{rel}"
            files.append(f)
    return files


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    markdown = MARKER.sub(lambda m: gen_reference.render(m.group(1)), markdown)
    if page.file.src_uri.startswith("../"):
        # a page from outside docs/ links as the checkout does: a page it names in docs/ is a page of the site (an
        # absolute link, relative to docs/), anything else a file of the repository as added above
        here = posixpath.dirname(page.file.src_uri.removeprefix("../"))

        def relink(m: re.Match) -> str:
            target = posixpath.normpath(posixpath.join(here, m.group(1)))
            page = target.startswith("docs/") and target.endswith(".md")
            return f"](/{target.removeprefix('docs/')}" if page else m.group(0)

        markdown = re.sub(r"\]\((?![a-z]+:|#|/)([^)#\s]+)", relink, markdown)
    return markdown
