"""The terminal side of `pyqsa chat`: an OpenAI-API streaming client with history."""

from __future__ import annotations

import json

import click
import httpx

HELP = (
    "/reset clears the history, /exit quits; Ctrl-C stops a reply; end a line with \\ "
    'to continue it, or wrap lines in """.'
)


class ChatSession:
    def __init__(
        self,
        url: str,
        api_key: str | None,
        system: str | None,
        max_tokens: int | None,
        temperature: float,
        ignore_eos: bool = False,
    ) -> None:
        self.base = url.rstrip("/").removesuffix("/v1") + "/v1"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(headers=headers, timeout=httpx.Timeout(10.0, read=None))
        self.system = system
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.ignore_eos = ignore_eos
        self.history: list[dict] = []
        self.model = ""

    def run(self) -> None:
        try:
            models = self.http.get(f"{self.base}/models")
            models.raise_for_status()
        except httpx.HTTPError as e:
            raise click.ClickException(f"cannot reach {self.base}: {e}") from e
        self.model = models.json()["data"][0]["id"]
        click.echo(f"pyqsa chat with {self.model}. {HELP}")
        while True:
            text = self._read()
            if text is None or text.strip() == "/exit":
                click.echo("bye")
                return
            if text.strip() == "/reset":
                self.history.clear()
                click.echo("(history cleared)")
                continue
            if text.strip():
                self._reply(text)

    def _read(self) -> str | None:
        """One user message; None on Ctrl-D."""
        lines: list[str] = []
        block = False
        while True:
            try:
                line = input("... " if lines else "> ")
            except EOFError:
                click.echo()
                return None
            except KeyboardInterrupt:
                click.echo("\n(Ctrl-C: input cleared; /exit quits)")
                lines, block = [], False
                continue
            if line.strip() == '"""':
                if block:
                    return "\n".join(lines)
                block = True
                continue
            if block:
                lines.append(line)
            elif line.endswith("\\"):
                lines.append(line[:-1])
            else:
                lines.append(line)
                return "\n".join(lines)

    def _reply(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})
        messages = [{"role": "system", "content": self.system}] if self.system else []
        body = {
            "model": self.model,
            "messages": messages + self.history,
            "stream": True,
            "temperature": self.temperature,
        }
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        if self.ignore_eos:
            body["ignore_eos"] = True
        parts: list[str] = []
        try:
            with self.http.stream("POST", f"{self.base}/chat/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    click.echo(f"[error {r.status_code}: {r.json()['error']['message']}]")
                    self.history.pop()
                    return
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[len("data: ") :])
                    if "error" in chunk:
                        click.echo(f"\n[error: {chunk['error']['message']}]")
                        break
                    for choice in chunk.get("choices", []):
                        piece = choice["delta"].get("content") or ""
                        parts.append(piece)
                        click.echo(piece, nl=False)
            click.echo()
        except KeyboardInterrupt:
            # NOTE: leaving the `with` closed the connection; the server cancels the
            # request and frees its slot. The partial reply stays in the history.
            click.echo("\n[stopped]")
        except httpx.HTTPError as e:
            click.echo(f"\n[connection error: {e}]")
        self.history.append({"role": "assistant", "content": "".join(parts)})
