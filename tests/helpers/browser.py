"""A page opened in headless Chromium, as a reader's browser opens it, driven over the DevTools protocol.

Chromium talks the protocol over a pipe (``--remote-debugging-pipe``: it reads commands from fd 3 and writes
replies and events to fd 4, each a JSON message ended by a NUL byte), so no websocket client and no port is needed.
The binary is Debian's ``chromium-headless-shell`` (or ``chromium``), installed by ``ops/install-test-deps``.
This machine has no network: the flags below stop every background fetch, which would otherwise flood refused
connections.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

BINARIES = ("chromium-headless-shell", "chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe")
TIMEOUT = 60.0  # seconds for one protocol reply or the page's load; Chromium starts in ~1 s on 2 idle cores

# Every figure on the page, as the browser sees it: an <img> is loaded when complete with a natural width (a missing
# or undecodable file leaves naturalWidth 0); an inline <svg> when it has a laid-out box.
FIGURES_JS = """JSON.stringify([
  ...[...document.images].map(i => ({kind: 'img', src: i.getAttribute('src'), loaded: i.complete && i.naturalWidth > 0,
                                    width: i.naturalWidth, height: i.naturalHeight})),
  ...[...document.querySelectorAll('svg')].map(s => {const r = s.getBoundingClientRect();
      return {kind: 'svg', src: s.id, loaded: r.width > 0 && r.height > 0, width: r.width, height: r.height};})])"""
TABLE_JS = """JSON.stringify([...document.querySelectorAll('#%s tr')].map(r =>
  [...r.cells].map(c => c.innerText.trim())))"""


class BrowserError(RuntimeError):
    pass


def chromium() -> str:
    for name in BINARIES:
        if path := shutil.which(name):
            return path
    raise BrowserError(f"none of {', '.join(BINARIES)} is on PATH: run `ops/install-test-deps` (Debian's package)")


@dataclass
class Figure:
    kind: str  # img | svg
    src: str
    loaded: bool
    width: float
    height: float


def group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies, dead but not yet reaped, do not count)."""
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


class Page:
    """One page in a fresh headless Chromium (its own profile directory), closed with the browser."""

    def __init__(self, url: str, width: int = 1280, height: int = 900) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="chromium-"))  # a fresh profile and the browser's log
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def as_fds_3_and_4() -> None:  # in the child, before exec; first above 4, so neither end overwrites the other
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome_r, from_chrome_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        with open(self.home / "chromium.log", "wb") as log:
            self.proc = subprocess.Popen(
                [chromium(), *FLAGS, f"--user-data-dir={self.home / 'profile'}", f"--window-size={width},{height}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, pass_fds=(3, 4),
                preexec_fn=as_fds_3_and_4)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        try:
            target = self._call("Target.createTarget", url="about:blank")["targetId"]
            self.session = self._call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            self.call("Page.enable")
            self.call("Network.enable")  # loadingFailed events name every resource that did not load
            self.call("Page.navigate", url=url)
            self._wait_event("Page.loadEventFired")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        # the browser and its helper processes, and only them: a session (and process group) of its own. All must
        # be gone before the profile is removed: a renderer still alive writes its Session Storage back into it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 10
        while group_running(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.home, ignore_errors=True)

    # --- the protocol
    def _send(self, method: str, params: dict, session: str | None) -> int:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params} | ({"sessionId": session} if session else {})
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("Chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise BrowserError(f"Chromium exited: {(self.home / 'chromium.log').read_text()[-2000:]}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _call(self, method: str, session: str | None = None, **params: Any) -> dict:
        wanted = self._send(method, params, session)
        deadline = time.monotonic() + TIMEOUT
        while True:
            message = self._receive(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def call(self, method: str, **params: Any) -> dict:
        return self._call(method, self.session, **params)

    def _wait_event(self, method: str) -> dict:
        deadline = time.monotonic() + TIMEOUT
        while True:
            for event in self.events:
                if event.get("method") == method:
                    return event
            self.events.append(self._receive(deadline))

    # --- what a test asks
    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def figures(self) -> list[Figure]:
        return [Figure(**f) for f in json.loads(self.evaluate(FIGURES_JS))]

    def table(self, table_id: str) -> list[list[str]]:
        """The rows of the table with this id, as the reader sees their cells' text (header row first)."""
        return json.loads(self.evaluate(TABLE_JS % table_id))

    def failed_loads(self) -> list[str]:
        """URLs of every resource the page asked for that did not load."""
        requests = {e["params"]["requestId"]: e["params"]["request"]["url"]
                    for e in self.events if e.get("method") == "Network.requestWillBeSent"}
        return [requests.get(e["params"]["requestId"], e["params"]["errorText"])
                for e in self.events if e.get("method") == "Network.loadingFailed"]

    def screenshot(self, path: Path) -> Path:
        """The whole page, top to bottom, as PNG."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path


def report_problems(report: Path) -> list[str]:
    """What a reader of ``report/index.html`` would find broken, as Chromium shows it: a figure the report
    directory holds that the page does not show, a figure that did not load (missing, or not a decodable image),
    any resource that failed to load, a page wider than the window (it scrolls sideways as a whole), or a claim
    table whose rows differ from ``claims.json``."""
    claims = json.loads((report / "claims.json").read_text())
    with Page((report / "index.html").resolve().as_uri()) as page:
        figures, rows, failed = page.figures(), page.table("claims"), page.failed_loads()
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    problems = [f"not loaded: {f.kind} {f.src}" for f in figures if not f.loaded]
    problems += [f"failed to load: {url}" for url in failed]
    if overflow > 0:
        problems.append(f"the page is {overflow} px wider than the window")
    shown = {f.src for f in figures}
    problems += [f"not on the page: {p.name}" for p in sorted(report.glob("*.png")) if p.name not in shown]
    if not figures:
        problems.append("no figure on the page")
    expected = [[c["paper"], c["claim"], c["status"]] for c in claims]
    if not rows or rows[0][:3] != ["paper", "claim", "check"] or [r[:3] for r in rows[1:]] != expected:
        problems.append(f"claim table: {len(rows) - 1 if rows else 'no'} rows shown, {len(expected)} in claims.json, "
                        "or their cells differ")
    return problems


def main() -> None:
    """``python -m tests.helpers.browser report/index.html [shot.png]``: the page's figures as Chromium loads them,
    and a screenshot of the whole page to look at."""
    import sys

    index = Path(sys.argv[1])
    with Page(index.resolve().as_uri()) as page:
        for figure in page.figures():
            print(f"{'ok    ' if figure.loaded else 'BROKEN'} {figure.kind} {figure.src} {figure.width}x{figure.height}")
        for url in page.failed_loads():
            print(f"FAILED {url}")
        if len(sys.argv) > 2:
            print(f"screenshot: {page.screenshot(Path(sys.argv[2]))}")


if __name__ == "__main__":
    main()
