#!/usr/bin/env python3
"""Serve this Spark's verified weights, read-only, to the other Sparks of the fleet (weight fan-out).

    share_weights.py --root MODEL_DIR --port PORT [--bind ADDRESS]

GET and HEAD of /<model>/<generation>/<path>, with Range (a killed copy resumes), and nothing else: a file is
served only when the generation's staging manifest lists it, so partial stages, other files and directory
listings are never exposed. Run by the sparkfleet-weights-share unit as an unprivileged dynamic user that can
only read. Stdlib only: it runs on the Spark's bare python3. Every copy is verified by the receiving Spark
against the controller's SHA256SUMS, as if it came from the source.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MANIFEST = ".sparkfleet-manifest.json"
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class Handler(BaseHTTPRequestHandler):
    server_version = "sparkfleet-share/1"
    root: Path = Path("/nonexistent")

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        self._serve(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(body=True)

    def _listed(self) -> Path | None:
        """The file the request names, if a verified generation lists it; None for anything else."""
        parts = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).strip("/").split("/")
        if len(parts) < 3 or any(part in ("", ".", "..") for part in parts):
            return None
        generation = self.root / parts[0] / parts[1]
        rel = "/".join(parts[2:])
        try:
            listed = json.loads((generation / MANIFEST).read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return generation / rel if rel in listed else None

    def _serve(self, body: bool) -> None:
        path = self._listed()
        if path is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start, end = 0, size - 1
            match = _RANGE.match(self.headers.get("Range", ""))
            if match and match.group(2) and int(match.group(2)) < int(match.group(1)):
                match = None  # an invalid range is ignored (RFC 9110, 14.2): the whole file
            if match:
                start = int(match.group(1))
                end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
                if start >= size:
                    self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.end_headers()
                    return
                self.send_response(HTTPStatus.PARTIAL_CONTENT)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            else:
                self.send_response(HTTPStatus.OK)
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if body:
                self.wfile.flush()
                self.connection.sendfile(handle, start, end - start + 1)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        pass  # one line per file would flood the journal; the receiving Spark logs its copies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="model_dir: <model>/<generation>/ beneath it")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bind", default="", help="address to listen on (default: all)")
    args = parser.parse_args()
    Handler.root = Path(args.root)
    ThreadingHTTPServer((args.bind, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
