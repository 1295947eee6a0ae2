"""The documentation: a short README that points into docs/, and an mkdocs site that builds with --strict (a broken
link, page or reference to the code fails)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_site_builds_strictly(tmp_path):
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    for name in ("apply_focus", "load_focus", "FocusConfig", "train_parameters", "FocusCache"):
        assert name in reference  # generated from the docstrings


def test_the_readme_is_short_and_its_links_into_docs_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    links = re.findall(r"\]\((docs/[^)#]+)\)", readme)
    assert len(links) >= 10 and all((ROOT / link).is_file() for link in links)
    for page in (ROOT / "docs").glob("*.md"):
        assert page.name == "index.md" or f"docs/{page.name}" in readme  # every page is reachable from the README
