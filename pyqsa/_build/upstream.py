"""The pinned upstream source: read UPSTREAM, download the sdist with pip, verify, extract.

Used by setup.py before the package is importable, so it depends on the standard library only.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM_FILE = ROOT / "UPSTREAM"
CACHE_DIR = ROOT / ".build" / "upstream"


class UpstreamError(RuntimeError):
    """The pinned upstream source could not be fetched, verified or extracted."""


@dataclass(frozen=True)
class Upstream:
    package: str
    version: str
    sdist: str
    sha256: str
    llama_cpp_commit: str
    llama_cpp_date: str

    @property
    def sdist_root(self) -> str:
        """Top folder inside the sdist tarball."""
        return self.sdist.removesuffix(".tar.gz")


def read_upstream(path: Path = UPSTREAM_FILE) -> Upstream:
    fields: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise UpstreamError(f"{path}: malformed line {line!r} (expected key = value)")
        fields[key.strip()] = value.strip()
    try:
        return Upstream(**fields)
    except TypeError as e:
        raise UpstreamError(f"{path}: {e}") from None


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_sdist(path: Path, up: Upstream) -> None:
    got = sha256_of(path)
    if got != up.sha256:
        raise UpstreamError(
            f"sha256 mismatch for {path.name}: expected {up.sha256} (from UPSTREAM), got {got}. "
            f"The download is corrupt or not the pinned release; delete {path} and retry."
        )


def download_sdist(up: Upstream, dest_dir: Path) -> Path:
    """Return the verified sdist in dest_dir, downloading it with pip when absent."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / up.sdist
    if not path.exists():
        print(
            f"pyqsa: downloading {up.package}=={up.version} sdist (pinned upstream)",
            file=sys.stderr,
            flush=True,
        )
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            # the sdist of this package only: ":all:" also made pip build the sdist's own build
            # requirements from source to read its metadata (minutes; now seconds)
            "--no-binary",
            up.package,
            "-d",
            str(dest_dir),
            f"{up.package}=={up.version}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not path.exists():
            raise UpstreamError(
                f"pip could not download {up.package}=={up.version}:\n{proc.stderr[-2000:]}"
            )
    verify_sdist(path, up)
    return path


def extract_llama_cpp(sdist: Path, up: Upstream, dest: Path) -> Path:
    """Extract the sdist once into dest (atomically); return dest.

    dest receives the whole sdist: vendor/llama.cpp is the C/C++ tree, llama_cpp/ the ctypes
    bindings that pyqsa reuses for upstream's C API.
    """
    stamp = dest / ".pyqsa-sha256"
    if stamp.exists() and stamp.read_text().strip() == up.sha256:
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        # extraction filters came with Python 3.12 and 3.10.12 / 3.11.4; pyqsa supports older
        # 3.10 and 3.11 too (Debian 12 ships 3.11.2), where the sdist's pinned sha256, checked
        # before this, is what vouches for its paths
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp, filter="data")
        else:
            tar.extractall(tmp)
    inner = tmp / up.sdist_root
    if not (inner / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
        raise UpstreamError(f"{sdist.name} does not contain vendor/llama.cpp")
    (inner / ".pyqsa-sha256").write_text(up.sha256 + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    inner.rename(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


def fetch(cache_dir: Path = CACHE_DIR) -> Path:
    """Download (if needed), verify and extract the pinned sdist; return the extract's root."""
    up = read_upstream()
    dest = cache_dir / up.sdist_root
    stamp = dest / ".pyqsa-sha256"
    if stamp.exists() and stamp.read_text().strip() == up.sha256:
        return dest  # extracted from a verified sdist earlier (or carried, as on the GPU machine)
    sdist = download_sdist(up, cache_dir)
    return extract_llama_cpp(sdist, up, dest)
