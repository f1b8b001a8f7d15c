"""A tiny pricing service for examples/http-json.json, on a free loopback port.

POST /quote {"items": [{"item": "tea", "qty": 2}, ...]} -> {"lines": [...], "total": N}
(400 with {"error": ...} for an item it does not sell); GET /currency -> {"code": "GBP"}.
Writes its port to the file named by its first argument once it listens.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

PRICES = {"tea": 1.5, "scone": 2.5, "jam": 3.0}


class Handler(BaseHTTPRequestHandler):
    def answer(self, status, value):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/currency":
            self.answer(200, {"code": "GBP"})
        else:
            self.answer(404, {"error": "no such resource"})

    def do_POST(self):
        if self.path != "/quote":
            return self.answer(404, {"error": "no such resource"})
        length = int(self.headers.get("content-length", 0))
        try:
            items = json.loads(self.rfile.read(length))["items"]
        except (ValueError, KeyError, TypeError):
            return self.answer(400, {"error": "expected {\"items\": [...]}"})
        lines = []
        for line in items:
            price = PRICES.get(line.get("item"))
            if price is None:
                return self.answer(400, {"error": f"we do not sell {line.get('item')!r}"})
            lines.append({**line, "price": price, "subtotal": price * line["qty"]})
        self.answer(200, {"lines": lines, "total": sum(l["subtotal"] for l in lines)})

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Handler)
with open(sys.argv[1], "w") as f:
    f.write(str(server.server_address[1]))
server.serve_forever()
