"""scripts/clients-recorder.py PORT DIR: an effect sink for the clients' end-to-end checks
(scripts/e2e). It records each delivery the dispatcher makes, as sent (its headers, its raw
body, when it came), as DIR/<nanoseconds>.json, and answers 204: the clients then verify and
apply those very bytes. Python's standard library only; it runs until it is stopped."""

import base64
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Recorder(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        record = {
            "received_at": time.time(),
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": base64.b64encode(body).decode(),
        }
        name = os.path.join(self.server.directory, f"{time.time_ns()}.json")
        with open(name + ".new", "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(name + ".new", name)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def main(port, directory):
    os.makedirs(directory, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", int(port)), Recorder)
    server.directory = directory
    server.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:3])
