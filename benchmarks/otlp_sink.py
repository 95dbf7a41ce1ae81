"""A stand-in OTLP/HTTP trace collector for ``python -m benchmarks observability``: it answers 200
(an empty ExportTraceServiceResponse) to every ``POST /v1/traces`` and counts what came: requests
(span batches), bytes and spans (OTLP/JSON, as Titan exports them); and its own CPU time (it shares
the machine with what is measured). ``GET /stats`` returns the counts as JSON, ``GET /health``
answers 200.

Run it as ``python -m benchmarks.otlp_sink --port N`` (the benchmark starts it as a subprocess,
so its work does not share the load generator's interpreter)."""

from __future__ import annotations

import argparse
import gzip
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

TRACES_PATH = "/v1/traces"


def count_json_spans(data: bytes) -> int:
    """The spans in an OTLP/JSON ExportTraceServiceRequest (what Titan sends)."""
    request = orjson.loads(data)
    return sum(
        len(scope.get("spans", ()))
        for resource in request.get("resourceSpans", ())
        for scope in resource.get("scopeSpans", ())
    )


class Counts:
    def __init__(self, count_spans: Callable[[bytes], int] = count_json_spans):
        self._lock = threading.Lock()
        self._count_spans = count_spans
        self.batches = 0
        self.bytes = 0
        self.spans = 0
        self.unparsed = 0  # batches whose spans could not be counted
        self.other_requests = 0  # anything but POST /v1/traces, /stats and /health

    def add_batch(self, data: bytes, encoding: str) -> None:
        try:
            spans = self._count_spans(gzip.decompress(data) if encoding == "gzip" else data)
        except (ValueError, OSError, AttributeError, TypeError):  # not OTLP/JSON
            spans = None
        with self._lock:
            self.batches += 1
            self.bytes += len(data)
            if spans is not None:
                self.spans += spans
            else:
                self.unparsed += 1

    def add_other(self) -> None:
        with self._lock:
            self.other_requests += 1

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"batches": self.batches, "bytes": self.bytes, "spans": self.spans,
                    "unparsed": self.unparsed, "other_requests": self.other_requests,
                    "cpu_s": time.process_time()}  # fmt: skip


def make_server(port: int, counts: Counts, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    import json

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the exporter's session expects

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.split("?", 1)[0] != TRACES_PATH:
                counts.add_other()
                self._answer(404, b"", "text/plain")
                return
            counts.add_batch(data, (self.headers.get("Content-Encoding") or "").lower())
            self._answer(200, b"{}", "application/json")

        def do_GET(self) -> None:
            if self.path == "/stats":
                self._answer(200, json.dumps(counts.as_dict()).encode(), "application/json")
            elif self.path == "/health":
                self._answer(200, b"ok", "text/plain")
            else:
                counts.add_other()
                self._answer(404, b"", "text/plain")

        def log_message(self, format: str, *args: Any) -> None:
            pass  # no line per batch

    return ThreadingHTTPServer((host, port), Handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    server = make_server(args.port, Counts(), args.host)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
