"""A real headless browser for UI tests: Debian's Chromium driven over the Chrome DevTools Protocol.

No browser download and no extra Python package: Chromium comes from Debian (``chromium``), the protocol is
spoken over ``websockets`` (already installed with Airflow). Enough for what a user does on a page: open a URL,
type into fields, click, wait for text, read the page's text and keep a screenshot.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1000")


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class HeadlessChromium:
    """One Chromium process with one page. Use as a context manager."""

    def __init__(self, profile_dir: Path, *, binary: str | None = None):
        self.profile_dir = Path(profile_dir)
        self.binary = binary or chromium_binary()
        if self.binary is None:
            raise RuntimeError("chromium is not installed (Debian package 'chromium')")
        self._ids = itertools.count(1)
        self.proc: subprocess.Popen | None = None
        self.ws = None

    def __enter__(self) -> HeadlessChromium:
        from websockets.sync.client import connect

        self.profile_dir.mkdir(parents=True, exist_ok=True)
        port_file = self.profile_dir / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [self.binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile_dir}", "--remote-debugging-port=0",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=open(self.profile_dir / "chromium.log", "wb"),
            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start; see {self.profile_dir / 'chromium.log'}")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            pages = [t for t in json.load(answer) if t.get("type") == "page"]
        self._connection = connect(pages[0]["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024, open_timeout=10)
        self.ws = self._connection.__enter__()
        self.call("Page.enable")
        self.call("Runtime.enable")
        return self

    def __exit__(self, *exc) -> None:
        if self.ws is not None:
            self._connection.__exit__(None, None, None)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    # -- protocol --------------------------------------------------------------------------------------------------
    def call(self, method: str, timeout: float = 30.0, **params) -> dict:
        ident = next(self._ids)
        self.ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    # -- what a user does ------------------------------------------------------------------------------------------
    def open(self, url: str, timeout: float = 30.0) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", timeout, what=f"{url} to load")

    def wait_for(self, condition_js: str, timeout: float = 30.0, *, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.evaluate(f"Boolean({condition_js})"):
                    return
            except RuntimeError:
                pass  # the page is navigating
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or condition_js}; page text:\n{self.text()[:2000]}")
            time.sleep(0.2)

    def wait_for_text(self, text: str, timeout: float = 30.0, *, frame_js: str = "document") -> None:
        self.wait_for(f"({frame_js}).body && ({frame_js}).body.innerText.includes({json.dumps(text)})", timeout,
                      what=f"the text {text!r}")

    def type_into(self, selector: str, value: str) -> None:
        """Set an input's value the way typing does (React forms listen for input events)."""
        self.evaluate(f"""(() => {{
            const el = document.querySelector({json.dumps(selector)});
            if (!el) throw new Error('no element ' + {json.dumps(selector)});
            const setter = Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set;
            setter.call(el, {json.dumps(value)});
            el.dispatchEvent(new Event('input', {{bubbles: true}}));
            el.dispatchEvent(new Event('change', {{bubbles: true}}));
        }})()""")

    def click(self, selector: str) -> None:
        self.evaluate(f"""(() => {{
            const el = document.querySelector({json.dumps(selector)});
            if (!el) throw new Error('no element ' + {json.dumps(selector)});
            el.click();
        }})()""")

    def text(self) -> str:
        try:
            return self.evaluate("document.body ? document.body.innerText : ''") or ""
        except RuntimeError:
            return ""

    def url(self) -> str:
        return self.evaluate("location.href")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
