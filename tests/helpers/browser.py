"""A real headless Chromium (Debian's ``chromium``), driven through the DevTools protocol."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.needs import unavailable

CHROMIUM_INSTALL = "apt-get install -y --no-install-recommends chromium"


def chromium() -> str:
    """The path of Debian's ``chromium`` (skipped outside CI, failed under CI, when missing)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        unavailable(f"a real headless browser: chromium is not installed ({CHROMIUM_INSTALL})")
    return path


@dataclass
class Loaded:
    """What the browser made of a page."""

    dom: str
    """The rendered DOM (``document.documentElement.outerHTML``)."""
    text: str
    """What a person reads (``document.body.innerText``)."""
    errors: list[str]
    """Console errors and assertions, uncaught exceptions, and the browser's error log entries
    (a resource that failed to load, a blocked request): DevTools' levels, not guessed from text."""
    value: Any = None
    """The value of ``evaluate`` once the page was ready."""
    screenshot: bytes | None = None


def browse(url: str, ready: str, *, evaluate: str | None = None, screenshot: bool = False,
           window: tuple[int, int] = (1400, 1000), timeout: float = 60) -> Loaded:
    """Load ``url`` in headless Chromium (a fresh profile) through the DevTools protocol and wait
    until the JavaScript expression ``ready`` is true.

    Chromium's ``--enable-logging`` writes every console message at INFO level, whatever its
    level; the protocol's events carry the level, so errors are told from logs exactly.
    """
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        log_path = Path(profile) / "chromium.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-extensions", "--disable-dev-shm-usage", "--remote-debugging-port=0",
                 f"--user-data-dir={profile}/data", f"--window-size={window[0]},{window[1]}", "about:blank"],
                stdout=log, stderr=log, start_new_session=True)
        try:
            active = Path(profile) / "data" / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (active.is_file() and len(active.read_text().splitlines()) >= 2):
                assert proc.poll() is None and time.monotonic() < deadline, \
                    f"chromium did not start (exit code {proc.poll()}): {log_path.read_text()[-3000:]}"
                time.sleep(0.05)
            port, path = active.read_text().splitlines()[:2]
            return asyncio.run(_browse(f"ws://127.0.0.1:{port}{path}", url, ready, evaluate, screenshot, timeout))
        finally:
            try:
                proc.wait(timeout=5)  # Browser.close ends it; after a failure, it is killed
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


async def _browse(endpoint: str, url: str, ready: str, evaluate: str | None, screenshot: bool,
                  timeout: float) -> Loaded:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.ws_connect(endpoint, max_msg_size=0) as ws:
        page = _Devtools(ws)
        try:
            target = (await page.call("Target.createTarget", {"url": "about:blank"}))["targetId"]
            page.session = (await page.call("Target.attachToTarget", {"targetId": target, "flatten": True}))["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                await page.call(f"{domain}.enable")
            await page.call("Page.navigate", {"url": url})
            deadline = time.monotonic() + timeout
            while not await page.evaluate(f"!!({ready})"):
                assert time.monotonic() < deadline, f"{url}: not ready after {timeout} s; errors: {page.errors}"
                await asyncio.sleep(0.2)
            await asyncio.sleep(0.5)  # let late errors arrive
            shot = None
            if screenshot:
                shot = base64.b64decode((await page.call("Page.captureScreenshot", {"format": "png"}))["data"])
            value = await page.evaluate(evaluate) if evaluate else None
            dom = await page.evaluate("document.documentElement.outerHTML")
            text = await page.evaluate("document.body.innerText")
            return Loaded(dom, text, page.errors, value, shot)
        finally:
            with contextlib.suppress(Exception):  # the browser may be gone already
                await ws.send_json({"id": 0, "method": "Browser.close", "params": {}})


class _Devtools:
    """One page over the DevTools protocol: commands in turn, events gathered as they come."""

    def __init__(self, ws: Any) -> None:
        self.ws, self.session, self.next_id, self.errors = ws, None, 0, []

    async def call(self, method: str, params: dict[str, Any] | None = None, *, session: bool = True) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        await self.ws.send_json(msg)
        while True:
            got = await self.ws.receive_json(timeout=60)
            if got.get("id") == self.next_id:
                assert "error" not in got, f"{method}: {got['error']}"
                return got.get("result", {})
            self._event(got.get("method"), got.get("params") or {})

    async def evaluate(self, expression: str) -> Any:
        got = await self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        assert "exceptionDetails" not in got, got["exceptionDetails"]
        return got["result"].get("value")

    def _event(self, method: str | None, params: dict[str, Any]) -> None:
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = params.get("args") or []
            self.errors.append("console." + params["type"] + ": " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in args))
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails") or {}
            self.errors.append("uncaught: " + str((d.get("exception") or {}).get("description") or d.get("text")))
        elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
            e = params["entry"]
            self.errors.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip())
