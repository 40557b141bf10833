#!/usr/bin/env python3
"""A small JSON-RPC 2.0 client for `capsule serve` (one message per line on
a unix socket). As a program:

    serve_client.py SOCKET METHOD '{"identity": {"agent": "a", "peer": "p1"}, ...}'

prints the response. As a module: Client(path).call(method, params)."""
import json
import socket
import sys


class Client:
    def __init__(self, path, timeout=120):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""
        self.next_id = 1
        self.pending = {}

    def send(self, method, params=None, id=None):
        """Send a request without waiting; returns its id."""
        if id is None:
            id = self.next_id
            self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            msg["params"] = params
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        return id

    def send_raw(self, data):
        self.sock.sendall(data)

    def read(self):
        """The next message from the server."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def wait(self, id):
        """The response to request id (others are kept for later)."""
        while id not in self.pending:
            m = self.read()
            self.pending[m.get("id")] = m
        return self.pending.pop(id)

    def call(self, method, params=None):
        return self.wait(self.send(method, params))

    def close(self):
        self.sock.close()


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: serve_client.py SOCKET METHOD [JSON-PARAMS]")
    c = Client(sys.argv[1])
    params = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    print(json.dumps(c.call(sys.argv[2], params)))
