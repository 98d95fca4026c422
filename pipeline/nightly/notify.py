"""A night's summary to a chat webhook: an HTTP POST of ``{"text": ...}`` as JSON, the body that Slack's and
Mattermost's incoming webhooks, Microsoft Teams' connectors and Discord's Slack-compatible ones (``.../slack``)
accept.

    python -m pipeline.nightly.notify URL < summary.txt     # post stdin; exit 0 posted, 1 not, 2 a bad URL
    python -m pipeline.nightly.notify --check URL           # only check URL (exit 0 or 2)

The standard library only (and ``pipeline.common.urls``, as light), so that ``ops/nightly`` can run it from the checkout
with any Python, even where the checkout's venv is missing (it posts why its night did not run). A webhook URL holds its
secret in its path: it is named in logs and summaries only as its scheme and host (``pipeline.common.urls.redact``)."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from pipeline.common.urls import redact

TIMEOUT_S = 10  # per attempt: a webhook answers in well under a second
ATTEMPTS = 3  # a refused connection, a timeout, HTTP 429 or 5xx is tried again; any other answer is final
BACKOFF_S = 2.0  # before the second attempt; doubled before each next
MAX_CHARS = 3500  # chat tools cut or refuse long messages (Slack truncates at 40k, Teams refuses past ~28 KB)


class WebhookError(ValueError):
    """A webhook or link URL that cannot be posted to: named before anything runs."""


def check_url(url: str, option: str = "--notify") -> str:
    """``url`` if it is an absolute http(s) URL with a host, else WebhookError naming ``option``."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number in 0-65535)
    except ValueError as err:
        raise WebhookError(f"{option} {redact(url)!r} is not a URL: {err}") from None
    if parts.scheme not in ("http", "https"):
        shown = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        raise WebhookError(f"{option} {redact(url)!r} is not an http(s) URL ({shown}): give http://... or https://...")
    if not parts.hostname:
        raise WebhookError(f"{option} {redact(url)!r} names no host")
    if any(c.isspace() for c in url):
        raise WebhookError(f"{option} {redact(url)!r} holds white space: quote it whole, without spaces")
    return url


def shorten(text: str, limit: int = MAX_CHARS) -> str:
    """``text`` cut to ``limit`` characters at a line's end, saying so."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 80].rsplit("\n", 1)[0]
    return f"{cut}\n… (cut at {limit} characters: the rest is in the report)"


def post(url: str, text: str, attempts: int = ATTEMPTS, backoff_s: float = BACKOFF_S) -> str | None:
    """POSTs ``{"text": text}`` (cut to MAX_CHARS) to ``url``. None once a 2xx answer came; else why not, in one line
    that names the URL redacted (the caller reports it; nothing is raised)."""
    try:
        check_url(url)  # never a file:// or other scheme urllib would also open
    except WebhookError as err:
        return str(err)
    body = json.dumps({"text": shorten(text)}).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "capacity-atlas-nightly"},
    )
    why = ""
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            time.sleep(backoff_s * 2 ** (attempt - 2))
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
                answer.read()
            return None
        except urllib.error.HTTPError as err:
            detail = err.read(200).decode(errors="replace").strip()
            why = f"HTTP {err.code} {err.reason}" + (f": {detail}" if detail else "")
            if err.code != 429 and err.code < 500:  # the webhook refused this message: trying again will not help
                break
        except (urllib.error.URLError, OSError) as err:  # refused, unreachable, timed out, TLS
            why = str(getattr(err, "reason", err))
    tries = f" after {attempt} attempts" if attempt > 1 else ""
    return f"POST to {redact(url)} failed{tries}: {why}"


def main(argv: list[str]) -> int:
    check = argv[:1] == ["--check"]
    if len(argv) != 1 + check:
        print("usage: python -m pipeline.nightly.notify [--check] URL [< text]", file=sys.stderr)
        return 2
    try:
        url = check_url(argv[-1])
    except WebhookError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if check:
        return 0
    failed = post(url, sys.stdin.read())
    print(f"notify: {failed}" if failed else f"notify: posted to {redact(url)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
