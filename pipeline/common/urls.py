"""A URL as logs and summaries may show it: its scheme and host, never what may be secret."""

from __future__ import annotations

import urllib.parse


def redact(url: str) -> str:
    """``url`` without what may be secret (user, path, query): ``https://hooks.example.org/…``."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return url.split("://")[0] + "://…" if "://" in url else "…"
    if not parts.scheme or not host:
        return url if len(url) <= 12 else url[:12] + "…"
    rest = "/…" if (parts.path not in ("", "/") or parts.query or parts.username) else ""
    return f"{parts.scheme}://{host}{port}{rest}"
