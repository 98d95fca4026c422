"""A page opened in headless Chromium, as a reader's browser opens it, driven over the DevTools protocol.

Chromium talks the protocol over a pipe (``--remote-debugging-pipe``: it reads commands from fd 3 and writes
replies and events to fd 4, each a JSON message ended by a NUL byte), so no websocket client and no port is needed.
The binary is Debian's ``chromium-headless-shell`` (or ``chromium``), or Chrome for Testing's headless shell in the
user's cache, installed by ``ops/install-test-deps``; where it could install none, it wrote why, and a test that
opens a page skips with that reason.
This machine has no network: the flags below stop every background fetch, which would otherwise flood refused
connections.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import mimetypes
import os
import re
import shutil
import signal
import subprocess
import sys
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
# The page of `dvc plots show` loads vega, vega-lite and vega-embed from this CDN, which the tests must not need: every
# Page answers those requests from the copies vendored in tests/vendor/cdn/<name>@<version>/ (tests/vendor/README.md).
CDN = "https://cdn.jsdelivr.net/npm/"
VENDORED = Path(__file__).resolve().parents[1] / "vendor" / "cdn"
# what the CDN serves for a bare <name>@<version>: the package's file for browsers (its package.json's "jsdelivr")
CDN_FILES = {
    "vega@5.20.2": "build/vega.min.js",
    "vega-lite@5.2.0": "build/vega-lite.min.js",
    "vega-embed@6.18.2": "build/vega-embed.min.js",
}
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "capacity-atlas"
USER_BROWSER = CACHE / "browser" / "chrome-headless-shell-linux64" / "chrome-headless-shell"
MISSING = CACHE / "browser-missing"  # why ops/install-test-deps could install no browser

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
    if os.access(USER_BROWSER, os.X_OK):
        return str(USER_BROWSER)
    if MISSING.is_file() and "pytest" in sys.modules:  # the install could not have one: the test skips, saying why
        import pytest

        pytest.skip(f"{MISSING.read_text().strip()} (ops/install-test-deps)")
    raise BrowserError(f"none of {', '.join(BINARIES)} is on PATH, nor {USER_BROWSER}: run `ops/install-test-deps`")


def cdn_file(url: str) -> Path:
    """The vendored copy of what ``url`` (under ``CDN``) serves: ``<name>@<version>`` alone is ``CDN_FILES``' file,
    ``<name>@<version>/<path>`` that file (which may not be there: the CDN's 404)."""
    spec, _, path = url.removeprefix(CDN).partition("?")[0].partition("/")
    if spec not in CDN_FILES or not (VENDORED / spec).is_dir():
        raise BrowserError(f"{url}: no vendored copy of {spec} in {VENDORED}: vendor it (tests/vendor/README.md)")
    return VENDORED / spec / (path or CDN_FILES[spec])


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

    def __init__(self, url: str, width: int = 1280, height: int = 900, before_load: str | None = None) -> None:
        """``before_load``: a script run in the page before any of its own (to watch what the page does)."""
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
            self.call("Runtime.enable")  # exceptionThrown and consoleAPICalled events: the page's script errors
            self.call("Fetch.enable", patterns=[{"urlPattern": CDN + "*"}])  # paused for _answer_from_copy
            if before_load:
                self.call("Page.addScriptToEvaluateOnNewDocument", source=before_load)
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
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
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
        received = json.loads(message)
        if received.get("method") == "Fetch.requestPaused":
            self._answer_from_copy(received)
        return received

    def _answer_from_copy(self, paused: dict) -> None:
        """A CDN request that Fetch.enable paused, answered from its local copy (404 where the package has no such
        file, as the CDN answers): it must be answered, or the page waits for it. Sent without waiting for the reply,
        since this runs while another reply is awaited; the reply lands in ``events``."""
        request = paused["params"]
        path = cdn_file(request["request"]["url"])
        if path.is_file():
            # UTF-8, as the CDN says: else a script takes the page's charset, and DVC's page names none
            kind = f"{mimetypes.guess_type(path.name)[0] or 'application/octet-stream'}; charset=utf-8"
            answer = {"responseCode": 200, "responseHeaders": [{"name": "Content-Type", "value": kind}],
                      "body": base64.b64encode(path.read_bytes()).decode()}
        else:
            answer = {"responseCode": 404, "body": ""}
        self._send("Fetch.fulfillRequest", {"requestId": request["requestId"], **answer}, paused.get("sessionId"))

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
        """The expression's value (a promise's, once it settles)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
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

    def script_errors(self) -> list[str]:
        """The page's uncaught script errors, and the errors and warnings its scripts logged to the console."""
        found = []
        for event in self.events:
            if event.get("method") == "Runtime.exceptionThrown":
                details = event["params"]["exceptionDetails"]
                found.append(details.get("exception", {}).get("description") or details["text"])
            elif event.get("method") == "Runtime.consoleAPICalled" and event["params"]["type"] in ("error", "warning"):
                args = event["params"]["args"]
                found.append(f"console.{event['params']['type']}: "
                             + " ".join(str(a.get("value", a.get("description", ""))) for a in args))
        return found

    def screenshot(self, path: Path) -> Path:
        """The whole page, top to bottom, as PNG."""
        # clipped to the content's size: unclipped, a page that grew after it loaded (plots drawn by scripts) is cut
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)["data"]
        path.write_bytes(base64.b64decode(data))
        return path


def report_problems(report: Path) -> list[str]:
    """What a reader of ``report/index.html`` would find broken, as Chromium shows it: a figure the report
    directory holds that the page does not show, a figure that did not load (missing, or not a decodable image),
    any resource that failed to load, a page wider than the window (it scrolls sideways as a whole), a claim table
    that scrolls sideways (the verdicts are read whole, at the window's 1280 px), or claim tables whose rows differ
    from ``claims.json`` (the decided claims with their verdict, then the rest with what each needs)."""
    from pipeline.reporting.claims import ClaimStatus

    claims = json.loads((report / "claims.json").read_text())
    with Page((report / "index.html").resolve().as_uri()) as page:
        figures, failed = page.figures(), page.failed_loads()
        shown_claims = {table_id: page.table(table_id) for table_id in CLAIM_TABLES}
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        hidden = {table_id: page.evaluate(f"(t => t ? t.scrollWidth - t.clientWidth : 0)"
                                          f"(document.getElementById('{table_id}'))") for table_id in CLAIM_TABLES}
    problems = [f"not loaded: {f.kind} {f.src}" for f in figures if not f.loaded]
    problems += [f"failed to load: {url}" for url in failed]
    if overflow > 0:
        problems.append(f"the page is {overflow} px wider than the window")
    problems += [f"claim table {t}: {px} px of its columns scrolled out of sight" for t, px in hidden.items() if px > 0]
    shown = {f.src for f in figures}
    problems += [f"not on the page: {p.name}" for p in sorted(report.glob("*.png")) if p.name not in shown]
    if not figures:
        problems.append("no figure on the page")
    decided = [c for c in claims if ClaimStatus(c["status"]).decided]
    parts = {"claims": decided, "not-decided-claims": [c for c in claims if c not in decided]}
    if any(claim_rows_differ(shown_claims[t], parts[t], *CLAIM_TABLES[t]) for t in CLAIM_TABLES):
        shown = sum(len(rows) - 1 for rows in shown_claims.values() if rows)
        problems.append(f"claim table: {shown or 'no'} rows shown, {len(claims)} in claims.json, or their cells "
                        "differ")
    return problems


# the page's claim tables: id -> the column that sets each apart and the claims.json key it shows
CLAIM_TABLES = {"claims": ("verdict", "status"), "not-decided-claims": ("what it needs", "needs")}


def claim_rows_differ(rows: list[list[str]], claims: list[dict], column: str, key: str) -> bool:
    """Whether a claim table's rows (header first; none: no table) are not ``claims``, in order, by id, paper, the
    paper's words and ``column``."""
    if not rows:
        return bool(claims)
    named = ["claim", "paper", "the paper's words", column]
    if not set(named) <= set(rows[0]):
        return True
    at = [rows[0].index(name) for name in named]
    # the page shows markdown code (`paper`) as code: its text without the backticks
    expected = [[c["id"], f"{c['paper']}, {c['where']}", f"\u201c{c['claim']}\u201d", c[key].replace("`", "")]
                for c in claims]
    return [[r[i] for i in at] for r in rows[1:]] != expected


# Run before the page's own scripts: vega-embed, once its script defines it, wrapped so that the view each call draws
# is kept for VEGA_PLOTS_JS (the page itself is unchanged).
KEEP_VEGA_VIEWS_JS = """window.__vegaEmbeds = [];
Object.defineProperty(window, 'vegaEmbed', {configurable: true, set(embed) {
  const kept = (target, spec, options) => {
    const done = embed(target, spec, options);
    window.__vegaEmbeds.push({target: String(target), done});
    return done;
  };
  Object.defineProperty(window, 'vegaEmbed', {value: Object.assign(kept, embed), writable: true, configurable: true});
}});"""
# Per vegaEmbed call, once it settled: why it failed, or the size of what it drew on the page, the data marks drawn by
# type (read from the view as SVG: each line of each panel is one, each point, rect or text one), the texts of its
# titles (a facet's panel titles among them) and the values of its legends' scales.
VEGA_PLOTS_JS = """(async () => JSON.stringify(await Promise.all(window.__vegaEmbeds.map(async ({target, done}) => {
  const plot = {id: target.replace(/^#/, ''), error: null, width: 0, height: 0, marks: {}, titles: [], scales: {}};
  let view;
  try { view = (await done).view; } catch (e) { return {...plot, error: String(e)}; }
  const drawn = document.getElementById(plot.id).querySelector('.marks').getBoundingClientRect();
  [plot.width, plot.height] = [drawn.width, drawn.height];
  const svg = new DOMParser().parseFromString(await view.toSVG(), 'image/svg+xml');
  for (const group of svg.querySelectorAll('g.role-mark')) {
    const type = group.getAttribute('class').match(/mark-(\\w+)/)[1];
    plot.marks[type] = (plot.marks[type] || 0) + group.children.length;
  }
  plot.titles = [...svg.querySelectorAll('.role-title-text text')].map(t => t.textContent);
  for (const name of ['color', 'strokeDash', 'shape']) {
    try { plot.scales[name] = view.scale(name).domain(); } catch (e) { /* the plot has no such scale */ }
  }
  return plot;
}))))()"""
# vega-embed 6.18 compares the "v5" of a spec's $schema with the library's full version, and warns of the difference
# on every plot (DVC's own templates' too): not a problem of the page.
VERSION_NOTICE = re.compile(r"console\.warning: The (input|compiled) spec uses Vega(-Lite)? v5, but")


@dataclass
class VegaPlot:
    id: str  # the element it was drawn into: on DVC's page the plot's id, e.g. results_plots_frontier_csv
    error: str | None  # why vega-embed failed to draw it
    width: float
    height: float
    marks: dict[str, int]  # data marks by type: line, symbol, rect, text
    titles: list[str]
    scales: dict[str, list]  # legend scales' values: color, strokeDash, shape


def vega_plots(page_file: Path, screenshot: Path | None = None) -> tuple[list[VegaPlot], list[str]]:
    """Every plot vega-embed draws on a page (``dvc plots show`` or ``dvc plots diff``'s index.html), as Chromium
    draws it with the page's scripts from the CDN, and what is wrong with the page: a resource that failed to load, a
    script error or warning (Vega's too: an empty scale, a field not found). A screenshot to look at, if asked."""
    with Page(page_file.resolve().as_uri(), before_load=KEEP_VEGA_VIEWS_JS) as page:
        plots = [VegaPlot(**p) for p in json.loads(page.evaluate(VEGA_PLOTS_JS))]
        problems = [f"failed to load: {url}" for url in page.failed_loads()]
        problems += [e for e in page.script_errors() if not VERSION_NOTICE.match(e)]
        if screenshot:
            page.screenshot(screenshot)
    return plots, problems


def main() -> None:
    """``python -m tests.helpers.browser report/index.html [shot.png]``: the page's figures as Chromium loads them,
    and a screenshot of the whole page to look at."""
    import sys

    index = Path(sys.argv[1])
    with Page(index.resolve().as_uri()) as page:
        for figure in page.figures():
            status = "ok    " if figure.loaded else "BROKEN"
            print(f"{status} {figure.kind} {figure.src} {figure.width}x{figure.height}")
        for url in page.failed_loads():
            print(f"FAILED {url}")
        if len(sys.argv) > 2:
            print(f"screenshot: {page.screenshot(Path(sys.argv[2]))}")


if __name__ == "__main__":
    main()
