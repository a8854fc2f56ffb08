"""A real headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`).

No websocket and no driver package: Chromium reads commands on fd 3 and writes replies and events on
fd 4, each message JSON ended by a NUL byte (the transport Playwright and Puppeteer use). The page's
console messages, exceptions, log entries, network requests and JavaScript dialogs are recorded so a
test can assert there were none.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
          "--disable-background-networking", "--disable-component-update", "--disable-sync",
          "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
          "--remote-debugging-pipe"]


class BrowserError(RuntimeError):
    pass


def find_chromium() -> str | None:
    for candidate in (CHROMIUM, shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class PageRecord:
    """What the page did while loaded: every item here is a failure for a self-contained report."""

    console: list[dict] = field(default_factory=list)
    exceptions: list[dict] = field(default_factory=list)
    log_entries: list[dict] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[dict] = field(default_factory=list)


class Browser:
    """One Chromium process and one page (tab). Use as a context manager."""

    def __init__(self, executable: str, *, width: int = 1000, height: int = 900, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        self._profile = tempfile.mkdtemp(prefix="lossguard-chromium-")
        to_child_r, self._to_child_w = os.pipe()
        self._from_child_r, from_child_w = os.pipe()

        def wire_pipes() -> None:  # runs in the child before exec: fd 3 = commands in, fd 4 = replies out
            # Via fresh copies, so one pipe end already sitting on fd 3 or 4 is not overwritten first.
            # dup2 makes 3 and 4 inheritable; every other descriptor Python opened is not (PEP 446).
            hi_in, hi_out = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(hi_in, 3)
            os.dup2(hi_out, 4)

        self._proc = subprocess.Popen(
            [executable, *_FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=wire_pipes, close_fds=False)
        os.close(to_child_r)
        os.close(from_child_w)
        self._messages: queue.Queue = queue.Queue()
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self._next_id = 0
        self._events: list[dict] = []
        self.record = PageRecord()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    # -- transport -------------------------------------------------------------------------------------
    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_child_r, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._messages.put(None)
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                self._messages.put(json.loads(raw))

    def _drain_stderr(self) -> None:
        for line in self._proc.stderr:
            self._stderr.append(line)

    def _send(self, method: str, params: dict, session: bool) -> int:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_child_w, json.dumps(message).encode() + b"\0")
        return self._next_id

    def call(self, method: str, *, session: bool = False, **params):
        wanted = self._send(method, params, session)
        while True:
            message = self._next_message()
            if message.get("id") == wanted:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._on_event(message)

    def _next_message(self, deadline: float | None = None) -> dict:
        deadline = deadline or time.monotonic() + self.timeout_s
        try:
            message = self._messages.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise BrowserError(f"no reply from Chromium in {self.timeout_s}s") from None
        if message is None:
            tail = b"".join(self._stderr[-20:]).decode(errors="replace")
            raise BrowserError(f"Chromium closed the pipe (exit {self._proc.poll()}):\n{tail}")
        return message

    def _on_event(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method is None:
            return
        self._events.append(message)
        if method == "Runtime.consoleAPICalled":
            self.record.console.append(params)
        elif method == "Runtime.exceptionThrown":
            self.record.exceptions.append(params)
        elif method == "Log.entryAdded":
            self.record.log_entries.append(params.get("entry", {}))
        elif method == "Network.requestWillBeSent":
            self.record.requests.append(params.get("request", {}).get("url", ""))
        elif method == "Page.javascriptDialogOpening":
            self.record.dialogs.append(params)
            self._send("Page.handleJavaScriptDialog", {"accept": True}, session=True)

    # -- page --------------------------------------------------------------------------------------------
    def open(self, path: Path, *, settle_s: float = 0.5) -> PageRecord:
        """Load a local file and wait for its load event, then let late scripts run for `settle_s`."""
        self.record = PageRecord()
        self._events.clear()
        self.call("Page.navigate", session=True, url=path.resolve().as_uri())
        deadline = time.monotonic() + self.timeout_s
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            self._on_event(self._next_message(deadline))
        self.pump(settle_s)
        return self.record

    def pump(self, seconds: float) -> None:
        """Record events for a while (late console errors, requests, dialogs)."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            try:
                message = self._messages.get(timeout=left)
            except queue.Empty:
                return
            if message is None:
                raise BrowserError("Chromium exited")
            self._on_event(message)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, clip: dict | None = None) -> bytes:
        params = {"format": "png", "captureBeyondViewport": True}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        return base64.b64decode(self.call("Page.captureScreenshot", session=True, **params)["data"])

    def close(self) -> None:
        try:
            self._send("Browser.close", {}, session=False)
            self._proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
            self._proc.wait()
        finally:
            os.close(self._to_child_w)
            shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
