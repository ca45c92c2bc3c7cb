#!/usr/bin/env python3
"""An HTTP server on loopback that answers as a hostile or broken server does, for
remote_limits_test. What a GET gets depends on the first part of its path:

  /endless/...    200, no Content-Length, a body that never ends (the connection closes it);
  /declared/...   200 with "Content-Length: 1099511627776" (1 TiB), then a body that never ends;
  /error/...      500, no Content-Length, an error page that never ends;
  /trickle/...    200 with "Content-Length: 1048576", then one byte every --trickle-interval
                  seconds;
  /redirect/REST  302 to --redirect-to + "/" + REST (with a small body, as servers send).

Anything else is a 404. Every request is appended to --log, once it ended (the client closed the
connection, or the answer was sent), as one line "PATH<TAB>-<TAB>STATUS<TAB>BODY_BYTES_SENT" (the
format of tests/shard_http_server.py's log). Standard library only.
"""
import argparse
import http.server
import socketserver
import sys
import threading
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--trickle-interval", type=float, default=0.1)
    parser.add_argument("--redirect-to", default="")
    args = parser.parse_args()
    lock = threading.Lock()
    chunk = b"x" * 65536

    def log(path, status, sent):
        with lock, open(args.log, "a") as f:
            f.write("%s\t-\t%d\t%d\n" % (path, status, sent))

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *unused):
            pass

        def answer(self, status, headers):
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()

        # Writes `piece` until the client goes away (or `count` pieces were sent), every `pause`
        # seconds; returns the bytes sent.
        def write_until_closed(self, piece, pause=0.0, count=None):
            sent = 0
            try:
                while count is None or sent < count * len(piece):
                    self.wfile.write(piece)
                    sent += len(piece)
                    if pause:
                        time.sleep(pause)
            except OSError:
                pass
            return sent

        def do_GET(self):
            path = self.path
            kind = path.lstrip("/").split("/", 1)[0]
            if kind == "endless":
                self.answer(200, [("Connection", "close")])
                log(path, 200, self.write_until_closed(chunk))
            elif kind == "declared":
                self.answer(200, [("Content-Length", str(1 << 40))])
                log(path, 200, self.write_until_closed(chunk))
            elif kind == "error":
                self.answer(500, [("Content-Type", "text/html"), ("Connection", "close")])
                log(path, 500, self.write_until_closed(chunk))
            elif kind == "trickle":
                self.answer(200, [("Content-Length", str(1 << 20))])
                log(path, 200, self.write_until_closed(b"x", args.trickle_interval, 1 << 20))
            elif kind == "redirect" and args.redirect_to:
                body = b"moved\n"
                rest = path.lstrip("/").split("/", 1)[1] if "/" in path.lstrip("/") else ""
                self.answer(302, [("Location", args.redirect_to + "/" + rest),
                                  ("Content-Length", str(len(body)))])
                self.wfile.write(body)
                log(path, 302, len(body))
            else:
                self.answer(404, [("Content-Length", "0")])
                log(path, 404, 0)
            self.close_connection = kind not in ("redirect",)

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", args.port), Handler)
    sys.stdout.write("serving on %d\n" % args.port)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
