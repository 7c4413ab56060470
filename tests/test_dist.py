# SPDX-License-Identifier: Apache-2.0
"""The distributions: the long description of the installed metadata. No GPU needed."""

import importlib.metadata
import re

DISTRIBUTION = "rmm-fences-cu13"


def _description() -> str:
    meta = importlib.metadata.metadata(DISTRIBUTION)
    assert meta["Description-Content-Type"].startswith("text/markdown")
    return meta.get_payload() or meta["Description"]


def test_the_long_description_stands_alone():
    """PyPI's page (docs/pypi.md): no link into the repository, no make target."""
    text = _description()
    assert text.startswith(f"# {DISTRIBUTION}\n")
    links = re.findall(r"\]\(([^)]*)\)", text)
    assert all(link.startswith("https://") for link in links), links
    assert "`make " not in text and "docs/" not in text
    assert f"pip install {DISTRIBUTION}" in text
