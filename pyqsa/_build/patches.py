"""The ggml_patches/ series: apply it to a tree, regenerate a patch from edits.

The patched tree is a git repository: commit `upstream` is the pristine vendor/llama.cpp,
then one commit per patch. Re-applying checks out `upstream` and applies the series again, which
writes every patched file twice; a file that ends with the content it had keeps its time, so a
build redoes only what a changed patch changed (ggml.h is patched: a new time there alone would
rebuild every object).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATCH_DIR = ROOT / "ggml_patches"
STAMP = ".pyqsa-series"
GIT_ID = ["-c", "user.name=pyqsa", "-c", "user.email=pyqsa@localhost", "-c", "core.autocrlf=false"]


class PatchError(RuntimeError):
    """A patch of the series does not apply."""


def series(patch_dir: Path = PATCH_DIR) -> list[Path]:
    """The patches in application order (NNNN-*.patch)."""
    return sorted(p for p in patch_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"))


def series_digest(patches: list[Path]) -> str:
    h = hashlib.sha256()
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _git(tree: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", *GIT_ID, *args], cwd=tree, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise PatchError(f"git {' '.join(args)} failed in {tree}:\n{proc.stderr.strip()}")
    return proc


def init_tree(pristine: Path, tree: Path) -> None:
    """Make tree a git repository holding a copy of pristine as commit `upstream`."""
    if (tree / ".git").exists() and _git(
        tree, "rev-parse", "-q", "--verify", "upstream", check=False
    ).returncode == 0:
        return
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(
        pristine,
        tree,
        symlinks=True,
        ignore=shutil.ignore_patterns(".git", ".gitignore", ".gitmodules"),
    )
    _git(tree, "init", "-q")
    _git(tree, "add", "-A", "-f")
    _git(tree, "commit", "-q", "--no-verify", "-m", "upstream")
    _git(tree, "tag", "upstream")


def apply_series(tree: Path, patches: list[Path] | None = None) -> bool:
    """Bring tree to `upstream` + patches. Returns False when it already was (nothing done)."""
    patches = series() if patches is None else patches
    digest = series_digest(patches)
    stamp = tree / ".git" / STAMP
    if stamp.exists() and stamp.read_text() == digest:
        return False
    before = _patched_files(tree)
    _git(tree, "checkout", "-q", "-f", "-B", "pyqsa", "upstream")
    _git(tree, "clean", "-q", "-f", "-d")
    for p in patches:
        proc = _git(tree, "apply", "--index", "--whitespace=nowarn", str(p), check=False)
        if proc.returncode != 0:
            raise PatchError(
                f"patch {p.name} does not apply to the pinned upstream:\n{proc.stderr.strip()}"
            )
        _git(tree, "commit", "-q", "--no-verify", "--allow-empty", "-m", p.name)
    for path, (content, mtime_ns) in before.items():
        if path.is_file() and hashlib.sha256(path.read_bytes()).digest() == content:
            os.utime(path, ns=(path.stat().st_atime_ns, mtime_ns))
    stamp.write_text(digest)
    return True


def _patched_files(tree: Path) -> dict[Path, tuple[bytes, int]]:
    """Each file the tree's patches (or uncommitted edits) changed from `upstream`: its content's
    digest and time."""
    if _git(tree, "rev-parse", "-q", "--verify", "HEAD", check=False).returncode != 0:
        return {}
    names = _git(tree, "diff", "--name-only", "-z", "upstream").stdout.split("\0")
    out = {}
    for name in filter(None, names):
        path = tree / name
        if path.is_file():
            out[path] = (hashlib.sha256(path.read_bytes()).digest(), path.stat().st_mtime_ns)
    return out


def regenerate(
    tree: Path, name: str, replace_last: bool = False, patch_dir: Path = PATCH_DIR
) -> Path:
    """Write the tree's uncommitted edits as a patch.

    name: 'NNNN-what.patch' for a new patch at the end of the series, or with replace_last the
    last patch's file name, folding the edits into it.
    """
    current = series(patch_dir)
    _git(tree, "add", "-A")
    if replace_last:
        if not current or current[-1].name != name:
            raise PatchError(f"{name} is not the last patch of the series")
        diff = _git(tree, "diff", "--cached", "HEAD~1").stdout
    else:
        diff = _git(tree, "diff", "--cached", "HEAD").stdout
    if not diff:
        raise PatchError("no edits in the tree to write as a patch")
    out = patch_dir / name
    out.write_text(diff)
    _git(tree, "commit", "-q", "--no-verify", "-m", name, *(["--amend"] if replace_last else []))
    (tree / ".git" / STAMP).write_text(series_digest(series(patch_dir)))
    return out
