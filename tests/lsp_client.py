"""A small synchronous LSP client for tests: runs `python -m tpuasm lsp` as a subprocess
and speaks JSON-RPC to it over stdin/stdout (Content-Length framing), as an editor does."""
from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time


class LspClient:
    def __init__(self, *args: str, cwd=None):
        self.proc = subprocess.Popen([sys.executable, "-m", "tpuasm", "lsp", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=cwd)
        self.next_id = 0
        self.responses: dict[int, dict] = {}
        self.notifications: "queue.Queue[dict]" = queue.Queue()
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    # -------------------------------------------------------------- wire
    def _send(self, message: dict) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    break
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            message = json.loads(out.read(length))
            if "id" in message and "method" not in message:
                with self.cond:
                    self.responses[message["id"]] = message
                    self.cond.notify_all()
            elif "id" in message:              # a request from the server: accept it
                self._send({"id": message["id"], "result": None})
            else:
                self.notifications.put(message)

    # -------------------------------------------------------------- API
    def request(self, method: str, params=None, timeout: float = 20.0):
        self.next_id += 1
        rid = self.next_id
        self._send({"id": rid, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        with self.cond:
            while rid not in self.responses:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise TimeoutError(f"no answer to {method} "
                                       f"(server {'exited' if self.proc.poll() is not None else 'alive'})")
                self.cond.wait(left)
            message = self.responses.pop(rid)
        if "error" in message:
            raise LspError(message["error"])
        return message.get("result")

    def notify(self, method: str, params=None) -> None:
        self._send({"method": method, "params": params})

    def diagnostics(self, uri: str, timeout: float = 20.0) -> list[dict]:
        """The next diagnostics published for `uri`."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no diagnostics for {uri}")
            try:
                message = self.notifications.get(timeout=left)
            except queue.Empty:
                raise TimeoutError(f"no diagnostics for {uri}") from None
            if message.get("method") == "textDocument/publishDiagnostics" \
                    and message["params"]["uri"] == uri:
                return message["params"]["diagnostics"]

    def initialize(self, root_uri=None, encodings=None) -> dict:
        caps = {"textDocument": {"hover": {"contentFormat": ["markdown"]},
                                 "rename": {"prepareSupport": True}}}
        if encodings:
            caps["general"] = {"positionEncodings": encodings}
        result = self.request("initialize", {"processId": None, "rootUri": root_uri,
                                             "capabilities": caps})
        self.notify("initialized", {})
        return result

    def open(self, uri: str, text: str, version: int = 1) -> None:
        self.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "tasm", "version": version, "text": text}})

    def change(self, uri: str, version: int, text: str, range_=None) -> None:
        change = {"text": text} if range_ is None else {"range": range_, "text": text}
        self.notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                               "contentChanges": [change]})

    def close(self) -> int:
        try:
            self.request("shutdown", timeout=10)
            self.notify("exit")
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                stream.close()


class LspError(Exception):
    def __init__(self, error: dict):
        super().__init__(error.get("message"))
        self.error = error


def at(line: int, character: int) -> dict:
    return {"line": line, "character": character}


def doc(uri: str, line: int, character: int) -> dict:
    return {"textDocument": {"uri": uri}, "position": at(line, character)}
