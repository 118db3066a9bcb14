"""The build foundation: pinned upstream, patch series, native library, `pyqsa info`."""

import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyqsa import native
from pyqsa._build import native as native_build
from pyqsa._build import patches, upstream
from pyqsa.cli import main

UP = upstream.read_upstream()


@pytest.fixture(scope="module")
def extract():
    root = upstream.CACHE_DIR / UP.sdist_root
    if not (root / ".pyqsa-sha256").exists():
        pytest.fail("the build did not leave a verified upstream extract in .build/upstream")
    return root


def test_upstream_file_pins_sdist_and_commit():
    assert UP.package == "llama-cpp-python"
    assert UP.sdist == f"llama_cpp_python-{UP.version}.tar.gz"
    assert len(UP.sha256) == 64
    assert UP.llama_cpp_commit


def test_library_loads_and_reports_pinned_commit():
    assert native.version().endswith(f"(llama.cpp {UP.llama_cpp_commit})")
    b = native.build_info()
    assert b.upstream_commit == UP.llama_cpp_commit
    import pyqsa

    assert b.version == pyqsa.__version__


def test_upstream_ctypes_bindings_use_patched_library():
    import llama_cpp

    assert native.lib_dir() == (Path(llama_cpp.__file__).parent / "lib")
    info = llama_cpp.llama_print_system_info().decode()
    assert "CPU" in info


def test_no_library_exports_a_copy_of_the_cpp_runtime():
    """A strong (non-template) std:: definition exported by one of our libraries would
    interpose libstdc++ for every later library: the CUDA link once pulled a static libstdc++
    into libggml-cuda, and libllama's first stringstream crashed on that copy."""
    strong_std = re.compile(r" [TDBR] _ZN?K?S[a-z]")
    exported = {}
    for lib in sorted(native.lib_dir().glob("lib*.so*")):
        out = subprocess.run(
            ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        assert out.strip(), f"{lib.name}: no dynamic symbols read"
        exported[lib.name] = [ln for ln in out.splitlines() if strong_std.search(ln)][:3]
    assert "libllama.so" in exported
    assert not any(exported.values()), exported


def test_device_query_return_codes():
    ffi, lib = native.raw()
    n = lib.pyqsa_device_count()
    assert n >= 1
    out = ffi.new("pyqsa_device_info *")
    assert lib.pyqsa_device_info_get(n, out) == lib.PYQSA_ERR_OUT_OF_RANGE
    assert lib.pyqsa_device_info_get(-1, out) == lib.PYQSA_ERR_OUT_OF_RANGE
    assert lib.pyqsa_device_info_get(0, ffi.NULL) == lib.PYQSA_ERR_INVALID_ARG
    assert lib.pyqsa_build_info_get(ffi.NULL) == lib.PYQSA_ERR_INVALID_ARG
    assert any(d.type == "CPU" for d in native.devices())


def test_pyqsa_info_prints_commit_and_backend():
    res = CliRunner().invoke(main, ["info"])
    assert res.exit_code == 0, res.output
    assert UP.llama_cpp_commit in res.output
    backend = (native.lib_dir() / "VARIANT").read_text().strip().upper()
    assert f"backend:         {backend}" in res.output
    res = CliRunner().invoke(main, ["info", "--json"])
    doc = json.loads(res.output)
    assert doc["build"]["upstream_commit"] == UP.llama_cpp_commit


def test_series_applies_to_fresh_extract(extract, tmp_path):
    tree = tmp_path / "llama.cpp"
    patches.init_tree(extract / "vendor" / "llama.cpp", tree)
    assert patches.apply_series(tree) is True
    assert patches.apply_series(tree) is False  # idempotent: nothing rewritten
    assert "PYQSA_NATIVE_DIR" in (tree / "src" / "CMakeLists.txt").read_text()
    log = patches._git(tree, "log", "--format=%s").stdout.split()
    assert log[: len(patches.series())] == [p.name for p in reversed(patches.series())]


def test_broken_patch_is_refused_by_name(extract, tmp_path):
    tree = tmp_path / "llama.cpp"
    patches.init_tree(extract / "vendor" / "llama.cpp", tree)
    bad_dir = tmp_path / "series"
    bad_dir.mkdir()
    for p in patches.series():
        shutil.copy(p, bad_dir / p.name)
    first = sorted(bad_dir.iterdir())[0]
    text = first.read_text()
    # change a context line so one hunk no longer matches upstream
    first.write_text(
        text.replace(
            " target_link_libraries(llama PUBLIC ggml)",
            " target_link_libraries(llama PUBLIC ggml-changed)",
            1,
        )
    )
    assert first.read_text() != text
    with pytest.raises(patches.PatchError, match=first.name):
        patches.apply_series(tree, patches.series(bad_dir))


def _patched_copy(extract: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A tree with a copy of the series applied: (tree, the copy's folder)."""
    tree = tmp_path / "llama.cpp"
    patches.init_tree(extract / "vendor" / "llama.cpp", tree)
    series_dir = tmp_path / "series"
    series_dir.mkdir()
    for p in patches.series():
        shutil.copy(p, series_dir / p.name)
    patches.apply_series(tree, patches.series(series_dir))
    return tree, series_dir


def test_regenerate_writes_edits_as_new_patch(extract, tmp_path):
    tree, series_dir = _patched_copy(extract, tmp_path)
    (tree / "README.md").write_text((tree / "README.md").read_text() + "\npyqsa test edit\n")
    out = patches.regenerate(tree, "9999-test-edit.patch", patch_dir=series_dir)
    assert "+pyqsa test edit" in out.read_text()
    fresh = tmp_path / "fresh"
    patches.init_tree(extract / "vendor" / "llama.cpp", fresh)
    patches.apply_series(fresh, patches.series(series_dir))
    assert "pyqsa test edit" in (fresh / "README.md").read_text()


def test_reapplying_keeps_the_time_of_files_whose_content_did_not_change(extract, tmp_path):
    """A changed series rewrites every patched file while it applies again; those that end as
    they were keep their time (ggml.h among them), so a build redoes only what changed."""
    tree, series_dir = _patched_copy(extract, tmp_path)
    header, readme = tree / "ggml" / "include" / "ggml.h", tree / "README.md"
    old = 1_000_000_000_000_000_000  # 2001, older than any write now
    for path in (header, readme):
        os.utime(path, ns=(old, old))
    readme.write_text(readme.read_text() + "\npyqsa test edit\n")
    patches.regenerate(tree, "9999-test-edit.patch", patch_dir=series_dir)
    readme.write_text(readme.read_text() + "another line\n")  # an uncommitted edit, lost
    os.utime(readme, ns=(old, old))
    (series_dir / "9999-test-edit.patch").write_text(
        (series_dir / "9999-test-edit.patch").read_text().replace("pyqsa test edit", "pyqsa edit 2")
    )
    assert patches.apply_series(tree, patches.series(series_dir)) is True
    assert "PYQSA" in header.read_text() and header.stat().st_mtime_ns == old
    assert "pyqsa edit 2" in readme.read_text() and "another line" not in readme.read_text()
    assert readme.stat().st_mtime_ns > old


def test_sdist_hash_mismatch_is_refused(tmp_path):
    fake = tmp_path / UP.sdist
    fake.write_bytes(b"not the pinned sdist")
    with pytest.raises(upstream.UpstreamError, match="sha256 mismatch") as e:
        upstream.download_sdist(UP, tmp_path)
    assert UP.sha256 in str(e.value) and "delete" in str(e.value)


def test_download_notice_leaves_stdout_to_the_path(tmp_path, monkeypatch, capsys):
    # tests/gpu/pack.sh reads fetch()'s stdout as the extract's path: a download's progress line
    # must go to stderr (a fresh cache once gave pack.sh the notice as its path)
    def fake_pip(cmd, **kwargs):
        shutil.copy(upstream.CACHE_DIR / UP.sdist, tmp_path / UP.sdist)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(upstream.subprocess, "run", fake_pip)
    assert upstream.download_sdist(UP, tmp_path) == tmp_path / UP.sdist
    out, err = capsys.readouterr()
    assert out == "" and "downloading" in err


def test_cached_sdist_matches_pin():
    upstream.verify_sdist(upstream.CACHE_DIR / UP.sdist, UP)


@pytest.mark.parametrize("has_filters", [True, False])
def test_extract_works_with_and_without_tar_filters(tmp_path, monkeypatch, has_filters):
    """Pythons before 3.10.12 / 3.11.4 (Debian 12's 3.11.2) have no extraction filters:
    extracting the (hash-checked) sdist must not pass one there."""
    up = dataclasses.replace(UP, sdist="fake-1.0.tar.gz", sha256="0" * 64)
    sdist = tmp_path / up.sdist
    with tarfile.open(sdist, "w:gz") as tar:
        data = b"project(llama.cpp)\n"
        info = tarfile.TarInfo(f"{up.sdist_root}/vendor/llama.cpp/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    if not has_filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
        plain = tarfile.TarFile.extractall

        def extractall(self, path=".", members=None, *, numeric_owner=False, **kw):
            assert not kw, f"this Python's extractall takes no {sorted(kw)}"
            return plain(self, path, members, numeric_owner=numeric_owner)

        monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)
    dest = upstream.extract_llama_cpp(sdist, up, tmp_path / "extract")
    assert (dest / "vendor" / "llama.cpp" / "CMakeLists.txt").read_bytes() == data
    assert (dest / ".pyqsa-sha256").read_text().strip() == up.sha256


def test_cmake_args_from_the_environment_reach_configure(tmp_path, monkeypatch):
    """PYQSA_CMAKE_ARGS (tests/gpu/prebuild.sh: cuBLAS from its wheel, a stand-in libcuda)."""
    seen = []
    monkeypatch.setattr(native_build, "_run", seen.append)
    monkeypatch.setattr(native_build, "BUILD", tmp_path)
    monkeypatch.setenv("PYQSA_CMAKE_ARGS", "-DGGML_NATIVE=OFF '-DCMAKE_CUDA_FLAGS=-I/a b'")
    cfg = native_build.BuildConfig(cuda=True, cuda_archs="90a", extra_targets=(), jobs=1)
    native_build.configure(cfg, tmp_path / "src")
    assert "-DGGML_NATIVE=OFF" in seen[0] and "-DCMAKE_CUDA_FLAGS=-I/a b" in seen[0]


@pytest.mark.parametrize("machine, amx_off", [("x86_64", True), ("aarch64", False)])
def test_x86_builds_leave_out_upstreams_amx_products(tmp_path, monkeypatch, machine, amx_off):
    """Upstream's AMX products segfault on k-quant weights: an x86 build turns them off, keeping
    the compiler flags of the environment."""
    seen = []
    monkeypatch.setattr(native_build, "_run", seen.append)
    monkeypatch.setattr(native_build, "BUILD", tmp_path)
    monkeypatch.setattr(native_build.platform, "machine", lambda: machine)
    monkeypatch.setenv("CXXFLAGS", "-g")
    monkeypatch.delenv("PYQSA_CMAKE_ARGS", raising=False)
    cfg = native_build.BuildConfig(cuda=False, cuda_archs="", extra_targets=(), jobs=1)
    native_build.configure(cfg, tmp_path / "src")
    flags = [a for a in seen[0] if a.startswith(("-DCMAKE_C_FLAGS=", "-DCMAKE_CXX_FLAGS="))]
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    expected = [f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS=-g {no_amx}"]
    assert flags == (expected if amx_off else [])


def test_cmake_args_that_do_not_parse_are_one_line(tmp_path, monkeypatch):
    """An unclosed quote in PYQSA_CMAKE_ARGS stops the build with a line naming the variable."""
    monkeypatch.setattr(native_build, "_run", lambda *a, **k: pytest.fail(f"ran {a}"))
    monkeypatch.setattr(native_build, "BUILD", tmp_path)
    monkeypatch.setenv("PYQSA_CMAKE_ARGS", "-DGGML_NATIVE=OFF '-DCMAKE_CUDA_FLAGS=-I/a")
    cfg = native_build.BuildConfig(cuda=True, cuda_archs="90a", extra_targets=(), jobs=1)
    with pytest.raises(SystemExit, match=r"^PYQSA_CMAKE_ARGS: No closing quotation$"):
        native_build.configure(cfg, tmp_path / "src")


def test_prebuilt_is_staged_without_a_build(tmp_path, monkeypatch):
    """PYQSA_PREBUILT=1 (tests/gpu/prebuilt.sh unpacked a build made elsewhere into the build
    folder's bin/): build() stages those libraries, patching and CMake never run."""
    bin_dir = tmp_path / "cmake-cuda" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("libllama.so", "libllama.so.0", "libggml.so", "libggml.so.0", "libggml-cuda.so.0"):
        (bin_dir / name).write_bytes(name.encode())
    monkeypatch.setattr(native_build, "BUILD", tmp_path)
    monkeypatch.setattr(native_build, "PY_OUT", tmp_path / "py")
    monkeypatch.setattr(native_build, "_run", lambda *a, **k: pytest.fail(f"ran {a}"))
    monkeypatch.setattr(patches, "init_tree", lambda *a: pytest.fail("patched a tree"))
    monkeypatch.setenv("PYQSA_PREBUILT", "1")
    monkeypatch.setenv("PYQSA_CUDA", "1")
    lib = native_build.build()
    assert lib == tmp_path / "py" / "llama_cpp" / "lib"
    assert (lib / "VARIANT").read_text() == "cuda\n"
    assert (lib / "libggml-cuda.so.0").read_bytes() == b"libggml-cuda.so.0"
    assert (lib / "pyqsa.h").exists()


def test_the_prebuilt_stamp_follows_the_build_inputs_not_their_prose(tmp_path):
    """tests/gpu/prebuilt.sh's digest: a source change is a new build, a Markdown note in native/
    or a dev-corner study is not (either would make the GPU machine build again, minutes)."""
    repo = Path(__file__).resolve().parents[2]
    for name in ("native/src/op.cpp", "native/PAGING.md", "native/dev/study.cu", "ggml_patches/a"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("1\n")
    for name in ("pyqsa/_build/x.py", "pyqsa/__init__.py", "UPSTREAM", "setup.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("1\n")

    def digest() -> str:
        script = f'. "{repo}/tests/gpu/prebuilt.sh" && prebuilt_inputs "{tmp_path}"'
        return subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, check=True
        ).stdout

    first = digest()
    assert re.fullmatch(r"[0-9a-f]{16}\n", first)
    (tmp_path / "native/PAGING.md").write_text("measured again\n")
    (tmp_path / "native/dev/study.cu").write_text("2\n")
    assert digest() == first
    (tmp_path / "native/src/op.cpp").write_text("2\n")
    assert digest() != first
