#!/usr/bin/python3
"""The fake internet of the netd dev harness (run inside its "inet"
namespace as root): HTTP servers that say who they are and which header
fields they got, an echo server, a DNS server, an upstream CONNECT proxy.
Usage: servers.py LOGDIR"""
import http.server
import socket
import socketserver
import struct
import sys
import threading

LOG = sys.argv[1]

HTTP = ["203.0.113.10", "203.0.113.11", "198.51.100.7", "10.1.2.3", "169.254.169.254"]
ECHO = [("203.0.113.10", 443)]
DNS = ("192.0.2.53", 53)
PROXY = ("192.0.2.80", 3128)
A = {
    "allowed.test": ["203.0.113.10"],
    "two.test": ["198.51.100.7", "203.0.113.10"],
    "other.test": ["203.0.113.11"],
    "denied.test": ["198.51.100.7"],
    "rebind.test": ["10.1.2.3"],
    "meta.test": ["169.254.169.254"],
}
CNAME = {"www.allowed.test": "cdn.example-cdn.test"}
A["cdn.example-cdn.test"] = ["203.0.113.10"]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        addr, port = self.server.server_address[:2]
        if self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", str(10 << 20))
            self.end_headers()
            chunk = bytes(range(256)) * 256
            for _ in range(160):
                self.wfile.write(chunk)
            return
        names = ",".join(k for k in self.headers.keys())
        conn = self.headers.get("Connection", "")
        host = self.headers.get("Host", "")
        body = f"server={addr}:{port} path={self.path} host={host} connection={conn} fields={names}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class TServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        with open(f"{LOG}/echo.log", "a") as f:
            data = self.request.recv(65536)
            f.write(f"got {len(data)} bytes: {data[:40]!r}\n")
        if data:
            self.request.sendall(b"echo:" + data)


class Sink(socketserver.BaseRequestHandler):
    """Reads to end of file (the client's half-close), then says how much."""
    def handle(self):
        n = 0
        while True:
            d = self.request.recv(65536)
            if not d:
                break
            n += len(d)
        self.request.sendall(f"got {n}\n".encode())


class TCP(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


def dns_name(m, o):
    labels = []
    while m[o]:
        labels.append(m[o + 1:o + 1 + m[o]].decode())
        o += 1 + m[o]
    return ".".join(labels).lower(), o + 1


def dns_server():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(DNS)
    while True:
        m, src = s.recvfrom(4096)
        name, o = dns_name(m, 12)
        qtype = struct.unpack(">H", m[o:o + 2])[0]
        q = m[12:o + 4]
        with open(f"{LOG}/dns.log", "a") as f:
            f.write(f"query {name} {qtype} ar={struct.unpack('>H', m[10:12])[0]}\n")
        if name == "slow.test":
            continue
        rrs = []
        target = name
        if target in CNAME:
            t = CNAME[target]
            rd = b"".join(bytes([len(x)]) + x.encode() for x in t.split(".")) + b"\0"
            rrs.append(b"\xc0\x0c" + struct.pack(">HHIH", 5, 1, 30, len(rd)) + rd)
            target = t
        rcode = 0 if target in A else 3
        if qtype == 1:
            for a in A.get(target, []):
                rrs.append(b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(a))
        # CNAME-owned A records use the CNAME's name uncompressed.
        if name in CNAME and qtype == 1:
            t = CNAME[name]
            tn = b"".join(bytes([len(x)]) + x.encode() for x in t.split(".")) + b"\0"
            rrs = rrs[:1] + [tn + r[2:] for r in rrs[1:]]
        hdr = m[:2] + struct.pack(">BBHHHH", 0x81, 0x80 | rcode, 1, len(rrs), 0, 0)
        s.sendto(hdr + q + b"".join(rrs), src)


def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                b.shutdown(socket.SHUT_WR)
                return
            b.sendall(d)
    except OSError:
        pass


class Proxy(socketserver.BaseRequestHandler):
    def handle(self):
        c = self.request
        head = b""
        while b"\r\n\r\n" not in head:
            d = c.recv(4096)
            if not d:
                return
            head += d
        line = head.split(b"\r\n")[0].decode()
        hosts = [h.decode() for h in head.split(b"\r\n")[1:] if h.lower().startswith(b"host:")]
        with open(f"{LOG}/proxy.log", "a") as f:
            f.write(line + "".join(f" [{h}]" for h in hosts) + "\n")
        method, target, _ = line.split(" ")
        host, port = target.rsplit(":", 1)
        if method != "CONNECT" or host == "refuse.test":
            c.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        if host in A:
            host = A[host][0]
        try:
            u = socket.create_connection((host, int(port)), timeout=5)
        except OSError:
            c.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            return
        c.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        rest = head.split(b"\r\n\r\n", 1)[1]
        if rest:
            u.sendall(rest)
        t = threading.Thread(target=pipe, args=(u, c), daemon=True)
        t.start()
        pipe(c, u)
        t.join()


def main():
    servers = [TServer((a, 80), Handler) for a in HTTP]
    servers += [TCP(e, Echo) for e in ECHO]
    servers.append(TCP(("203.0.113.10", 9000), Sink))
    servers.append(TCP(PROXY, Proxy))
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    threading.Thread(target=dns_server, daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


main()
