"""A chat webhook for the tests: a real HTTP server on 127.0.0.1 (``http.server`` in a thread) that records every
POST and answers each with the next status of ``answers`` (200 once they run out)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Post:
    path: str
    content_type: str
    body: dict


@dataclass
class Webhook:
    url: str  # with a secret-looking path, as Slack's are: it must never be printed
    posts: list[Post] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)


@contextmanager
def webhook(path: str = "/hooks/T0AB/B0CD/s3cr3t-t0k3n") -> Iterator[Webhook]:
    """A webhook listening on a free loopback port until the block ends."""
    hook = Webhook("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            hook.posts.append(Post(self.path, self.headers["Content-Type"], body))
            status = hook.answers.pop(0) if hook.answers else 200
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"ok" if status == 200 else b"no_such_hook")

        def log_message(self, *args) -> None:  # quiet: the tests read the posts
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_port}{path}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
