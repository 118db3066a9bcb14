"""`pyqsa chat` in a pseudo-terminal: a reply streams, Ctrl-C stops it, /exit quits."""

from __future__ import annotations

import os
import re
import signal
import sys

import pexpect
from conftest import API_KEY, wait_idle


def spawn(args: list[str], cache_dir) -> pexpect.spawn:
    env = {**os.environ, "PYQSA_CACHE_DIR": str(cache_dir), "PYQSA_API_KEY": API_KEY}
    child = pexpect.spawn(
        sys.executable,
        ["-m", "pyqsa.cli", "chat", *args],
        env=env,
        encoding="utf-8",
        timeout=60,
        dimensions=(50, 500),
        # a test run started in the background inherits an ignored SIGINT, which Python keeps:
        # the chat must get the Ctrl-C a terminal user's would
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    child.expect("pyqsa chat with ")
    child.expect("> ")
    return child


def greedy_start(server, text: str) -> str:
    """The first tokens of the greedy reply to `text`, as the terminal shows them."""
    r = server.openai().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": text}],
        max_tokens=3,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    return r.choices[0].message.content.replace("\n", "\r\n")


def test_chat_against_a_server_ctrl_c_and_exit(server, cache_dir):
    # expected replies are computed first: alone in the server, as the chat's requests will be
    first, second = greedy_start(server, "hello"), greedy_start(server, "first line\nsecond line")
    # ignore_eos and a long limit: the reply is still streaming when Ctrl-C arrives
    args = ["--temperature", "0", "--max-tokens", "2000", "--ignore-eos"]
    child = spawn(["--url", server.url, *args], cache_dir)
    child.sendline("hello")
    child.expect(re.escape(first))  # the reply is streaming
    child.sendintr()
    child.expect(r"\[stopped\]")
    child.expect("> ")
    m = wait_idle(server)
    assert m["pyqsa_busy_slots"] == 0  # the stopped reply freed its slot
    assert m['pyqsa_requests_finished_total{reason="cancelled"}'] >= 1
    # the program survived Ctrl-C: history, /reset and multi-line input still work
    child.sendline("/reset")
    child.expect(r"\(history cleared\)")
    child.sendline("first line\\")
    child.expect(r"\.\.\. ")
    child.sendline("second line")
    child.expect(re.escape(second))
    child.sendintr()
    child.expect(r"\[stopped\]")
    child.sendline("/exit")
    child.expect("bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_chat_with_a_local_model(server, demo_gguf, cache_dir):
    expected = greedy_start(server, "hello")  # the same model and prompt behind the server
    child = spawn(
        [str(demo_gguf), "--slots", "1", "--ctx", "256", "--temperature", "0", "--max-tokens", "4"],
        cache_dir,
    )
    child.sendline("hello")
    child.expect(re.escape(expected))
    child.expect("> ")
    child.sendeof()  # Ctrl-D quits too
    child.expect("bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
