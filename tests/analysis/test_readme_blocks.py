"""analysis/readme_blocks.py: every generated block is on the page its writer targets."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "analysis"))

import readme_blocks as rb  # noqa: E402

BLOCK = re.compile(r"<!-- generated:([\w-]+) -->\n.*?<!-- /generated:\1 -->", re.S)


def _blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


def test_front_page_keeps_only_the_headline_and_the_main_job_line():
    assert sorted(_blocks(rb.README)) == ["headline", "main-job-time"]


@pytest.mark.parametrize("name", sorted(rb.BLOCK_FILES))
def test_each_moved_block_is_once_on_its_page(name):
    assert _blocks(rb.BLOCK_FILES[name]).count(name) == 1


def test_replace_block_writes_the_mapped_page_by_default(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("a\n<!-- generated:x -->\nold\n<!-- /generated:x -->\nb\n")
    readme = tmp_path / "README.md"
    readme.write_text("front\n")
    monkeypatch.setattr(rb, "README", readme)
    monkeypatch.setattr(rb, "BLOCK_FILES", {"x": page})
    rb.replace_block("x", "new")
    assert page.read_text() == "a\n<!-- generated:x -->\nnew\n<!-- /generated:x -->\nb\n"
    assert readme.read_text() == "front\n"
    with pytest.raises(SystemExit, match="README.md: no <!-- generated:y --> block"):
        rb.replace_block("y", "new")
