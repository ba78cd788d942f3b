"""`pasu cloud serve` as a benchmark's subprocess: started on a free loopback port, its JSON log read as it runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any


class ServerProcess:
    """`pasu cloud serve` in a subprocess; its JSON log is read on a thread (rpc lines counted by code)."""

    def __init__(self, model: Path, flags: tuple[str, ...] = (), timeout_s: float = 300.0):
        # flags: further `pasu cloud serve` flags (--token-file, --threads, ...); the port is always a free one.
        command = [sys.executable, "-m", "pasu.cli", "cloud", "serve", "--model", str(model), "--host", "127.0.0.1",
                   "--port", "0", "--no-metrics", *flags]
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "GRPC_VERBOSITY": "ERROR"})
        self.serving: dict[str, Any] = {}
        self.codes: Counter[str] = Counter()  # the server's own count of finished RPCs
        self.other_lines: list[str] = []  # anything not an rpc line (errors, tracebacks), last 50
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout_s) or not self.serving:
            self.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.other_lines[-20:]))

    @property
    def address(self) -> str:
        return self.serving["address"]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (graceful) and the exit code; SIGKILL if it does not stop in time."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            entry = _json(line)
            if entry is not None and entry.get("msg") == "rpc":
                self.codes[entry.get("code", "?")] += 1
                continue
            if entry is not None and entry.get("msg") == "serving":
                self.serving = entry
                self._ready.set()
            self.other_lines = [*self.other_lines[-49:], line]
        self._ready.set()  # exited


def _json(line: str) -> dict | None:
    if not line.startswith("{"):
        return None
    try:
        return json.loads(line)
    except ValueError:
        return None
