"""`pyqsa serve --api-key-file`: the key comes from a file, and wrong use stops before loading.
Engine flags with bad values are one-line usage errors."""

from click.testing import CliRunner

from pyqsa.cli import main

NO_ENV_KEY = {"PYQSA_API_KEY": None}


def test_key_file_and_key_together_are_refused(tmp_path):
    key = tmp_path / "key"
    key.write_text("k\n")
    args = ["serve", "--api-key", "k", "--api-key-file", str(key)]
    r = CliRunner().invoke(main, args, env=NO_ENV_KEY)
    assert r.exit_code == 2 and "not both" in r.output
    r = CliRunner().invoke(main, ["serve", "--api-key-file", str(key)], env={"PYQSA_API_KEY": "k"})
    assert r.exit_code == 2 and "not both" in r.output


def test_empty_key_file_is_refused(tmp_path):
    key = tmp_path / "key"
    key.write_text(" \n")
    r = CliRunner().invoke(main, ["serve", "--api-key-file", str(key)], env=NO_ENV_KEY)
    assert r.exit_code == 2 and "holds no key" in r.output


def test_bad_engine_flags_are_one_line_errors():
    for args, what in (
        (["--kv-type", "q4_0"], "'--kv-type'"),
        (["--gpu-layers", "-1"], "'--gpu-layers'"),
        (["--prefill-policy", "lifo"], "'--prefill-policy'"),
        (["--default-max-tokens", "0"], "'--default-max-tokens'"),
        (["--kv-offload", "gpu"], "'--kv-offload'"),
        (["--kv-offload", ""], "'--kv-offload'"),
        (["--hot-blocks", "0"], "'--hot-blocks'"),
        (["--hot-blocks", "-3"], "'--hot-blocks'"),
        (["--hot-blocks", "eight"], "'--hot-blocks'"),
    ):
        r = CliRunner().invoke(main, ["serve", *args], env=NO_ENV_KEY)
        assert r.exit_code == 2 and f"Invalid value for {what}" in r.output, r.output


def test_hot_blocks_without_paging_is_a_usage_error():
    for cmd in ("serve", "chat"):
        args = [cmd, "--kv-offload", "none", "--hot-blocks", "8"]
        r = CliRunner().invoke(main, args, env=NO_ENV_KEY)
        assert r.exit_code == 2, r.output
        errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
        assert errors == ["Error: --hot-blocks needs paging: --kv-offload host or auto, not none"]
