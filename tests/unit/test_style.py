"""The repo's Python follows the style guide's tooling: ruff lint and format, line length 100;
its tracked files name commits, dates and result files, not numbered work rounds."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff(args):
    ruff = shutil.which("ruff")
    assert ruff, "ruff is a test dependency (pip install -e '.[test]')"
    proc = subprocess.run([ruff, *args], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]


# Tracked files speak of the software, not of how it was made: no numbered work rounds or
# tracker items ("<word> 11", "<word> #11", "<word>-11", also across a wrapped line). The words
# are joined here so that this file's own source does not match; the word alone ("a known
# <word>") is fine, only a number after it trips the check.
_ROUND_WORDS = ("sess" + "ion", "iss" + "ue", "rou" + "nd")
_ROUND_RE = re.compile(
    r"\b(?:" + "|".join(_ROUND_WORDS) + r")s?(?:[ \t]*|[ \t]*\n[ \t#/*]*)[-#]?[ \t]*\d",
    re.IGNORECASE,
)
_BINARY_SUFFIXES = {".gguf", ".png", ".jpg", ".jpeg", ".gif", ".bin", ".safetensors", ".npy"}


def _tracked_files() -> list[str]:
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    proc = subprocess.run([git, "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    return [p for p in proc.stdout.split("\0") if p]


def _round_references(name: str, text: str) -> list[str]:
    return [f"{name}:{text.count(chr(10), 0, m.start()) + 1}" for m in _ROUND_RE.finditer(text)]


def test_round_pattern():
    word = _ROUND_WORDS[1]
    assert _round_references("f", f"as {word} 11 measured")
    assert _round_references("f", f"{_ROUND_WORDS[0].title()} 9's server")
    assert _round_references("f", f"({word} #11)") and _round_references("f", f"{word}-11")
    assert _round_references("f", f"a\nb ({_ROUND_WORDS[0]}\n# 12) c") == ["f:2"]
    assert not _round_references("f", f"a known {word}; the {word}s\n\nsolved, {word}d on 2 GPUs")
    assert not _round_references("f", "round(t * 1e3, 3) and rounded to f16; ChatSession(url)")


def test_no_round_references():
    found = []
    for name in _tracked_files():
        path = ROOT / name
        if _ROUND_RE.search(name):
            found.append(f"{name} (its name)")
        if Path(name).suffix.lower() in _BINARY_SUFFIXES or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        found += _round_references(name, data.decode("utf-8", errors="replace"))
    assert not found, "numbered work rounds or tracker items in tracked files:\n" + "\n".join(
        found[:50]
    )


# Relative links of the user docs (`[text](path)` or `](path#anchor)`) name files that exist. A
# link leaving the checkout (the design notes beside it) cannot be checked from a clean clone and
# is skipped; so are web addresses and in-page anchors.
_LINK_RE = re.compile(r"\]\(([^)\s]+)\)")


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _broken_links(doc: Path, text: str) -> list[str]:
    broken = []
    for m in _LINK_RE.finditer(text):
        target = m.group(1).split("#", 1)[0]
        if not target or re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue
        path = (doc.parent / target).resolve()
        if not path.is_relative_to(ROOT):
            continue
        if not path.exists():
            line = text.count("\n", 0, m.start()) + 1
            broken.append(f"{doc.relative_to(ROOT)}:{line}: {m.group(1)}")
    return broken


def test_link_pattern():
    doc = ROOT / "docs" / "x.md"
    text = "[a](serve.md) [b](../README.md#top) [c](https://x.org/y) [d](#flags) [e](nope.md)"
    assert _broken_links(doc, text) == ["docs/x.md:1: nope.md"]
    assert not _broken_links(ROOT / "README.md", "[design](../../outside/DESIGN.md)")


def test_doc_links_exist():
    docs = _doc_files()
    assert len(docs) > 1, "docs/*.md is missing"
    broken = [b for doc in docs for b in _broken_links(doc, doc.read_text())]
    assert not broken, "relative links to missing files:\n" + "\n".join(broken)
