#!/usr/bin/env python3
"""A small static HTTP server for the shard tests (plain_http_shards_test), on Python's
http.server. Without switches it answers as `python3 -m http.server` does: HTTP 200 and the whole
file for every GET, whatever Range asks. Two switches make the faults the tests need:

  --ranges          honour "Range: bytes=A-" and "bytes=A-B" with 206 and Content-Range (and
                    If-Range against Last-Modified), as a server that supports resuming does;
  --drop-after N    on the first GET of each .tar file, send the headers and N bytes of the body,
                    then close the connection (a connection dropped in the middle of a shard).

Every request is appended to --log as one line: "PATH<TAB>RANGE<TAB>STATUS<TAB>BODY_BYTES".
Standard library only.
"""
import argparse
import email.utils
import http.server
import os
import re
import socketserver
import sys
import threading


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ranges", action="store_true")
    parser.add_argument("--drop-after", type=int, default=-1)
    parser.add_argument("--log", default="")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    dropped = set()
    lock = threading.Lock()

    def log(path, range_header, status, sent):
        if not args.log:
            return
        with lock, open(args.log, "a") as f:
            f.write("%s\t%s\t%d\t%d\n" % (path, range_header or "-", status, sent))

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *unused):
            pass

        def do_GET(self):
            path = os.path.normpath(os.path.join(root, self.path.split("?")[0].lstrip("/")))
            range_header = self.headers.get("Range")
            if not path.startswith(root) or not os.path.isfile(path):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                log(self.path, range_header, 404, 0)
                return
            size = os.path.getsize(path)
            mtime = os.path.getmtime(path)
            last_modified = email.utils.formatdate(mtime, usegmt=True)
            first, last, status = 0, size - 1, 200
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header or "")
            if_range = self.headers.get("If-Range")
            if args.ranges and match and (if_range is None or if_range == last_modified):
                first = int(match.group(1))
                last = min(size - 1, int(match.group(2))) if match.group(2) else size - 1
                if first >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", "bytes */%d" % size)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    log(self.path, range_header, 416, 0)
                    return
                status = 206
            length = last - first + 1
            self.send_response(status)
            self.send_header("Content-Type", "application/x-tar")
            self.send_header("Content-Length", str(length))
            self.send_header("Last-Modified", last_modified)
            if status == 206:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (first, last, size))
            self.end_headers()
            limit = length
            drop = False
            with lock:
                if args.drop_after >= 0 and path.endswith(".tar") and path not in dropped:
                    dropped.add(path)
                    drop = True
            if drop:
                limit = min(length, args.drop_after)
            sent = 0
            with open(path, "rb") as f:
                f.seek(first)
                while sent < limit:
                    chunk = f.read(min(65536, limit - sent))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    sent += len(chunk)
            self.wfile.flush()
            log(self.path, range_header, status, sent)
            if drop:
                self.close_connection = True
                self.connection.shutdown(2)  # the client sees the body end early

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", args.port), Handler)
    sys.stdout.write("serving on %d\n" % args.port)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
