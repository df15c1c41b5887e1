"""A headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: no
port, no websocket library): open a page, evaluate JavaScript in it, wait for a condition, save a
screenshot. Enough for the playground test (tests/server/test_playground_browser.py)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

BROWSER = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)


class Browser:
    """One headless Chromium with one page; `with Browser(profile) as b: b.open(url)`."""

    def __init__(self, profile: Path, size: tuple[int, int] = (1200, 800)) -> None:
        to_child, self._out = os.pipe()  # the browser reads commands on its fd 3
        self._in, from_child = os.pipe()  # and writes answers on its fd 4

        def fds() -> None:
            os.dup2(to_child, 3)
            os.dup2(from_child, 4)

        cmd = [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            "about:blank",
        ]
        self.proc = subprocess.Popen(
            cmd,
            preexec_fn=fds,
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # pass_fds: the fds the child's preexec_fn set up survive close_fds
        os.close(to_child)
        os.close(from_child)
        self._next, self._buffer, self.session = 0, b"", None

    def call(self, method: str, **params: Any) -> dict:
        """Send one command (to the page once `open` attached it) and return its result."""
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if self.session is not None:
            msg["sessionId"] = self.session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._in, 1 << 20)
                assert chunk, "the browser closed its pipe"
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._next:
                assert "error" not in answer, answer["error"]
                return answer["result"]

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", url=url)["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait(self, expression: str, timeout: float = 60.0) -> None:
        """Poll until `expression` is truthy (a page still loading may throw: not yet)."""
        deadline = time.monotonic() + timeout
        while not self._value(expression):
            assert time.monotonic() < deadline, f"timed out waiting for {expression}"
            time.sleep(0.1)

    def _value(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return None if "exceptionDetails" in result else result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(
            base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        )

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self._out)
        os.close(self._in)
