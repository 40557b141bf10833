#!/usr/bin/env python3
"""Network figures for make bench (row (j)), standard library only.

  bench-net.py serve ADDR         a server on ADDR: port 7 sends one byte on
                                  accept; port 80 answers GET /10mb with 10 MB
  bench-net.py connect ADDR N     N connects to ADDR:7, each to its first byte;
                                  prints the median in microseconds
  bench-net.py fetch ADDR N       N downloads of ADDR:80/10mb; prints the
                                  median MB/s
  bench-net.py serve-https LOGDIR CERTDIR
                                  tests/net/fakenet.py's HTTPS APIs (api.test
                                  203.0.113.20, plain.test 203.0.113.23, with
                                  CERTDIR's certificates) and its DNS
                                  (203.0.113.53) answering their names
  bench-net.py https NAME N CAFILE [PROXY]
                                  N HTTPS requests to NAME:443, each on a new
                                  connection (TLS verified against CAFILE,
                                  "Connection: close"), directly or through
                                  the HTTP proxy PROXY (ADDR:PORT) by CONNECT;
                                  prints the median request latency in ms
"""
import os
import ssl
import socket
import statistics
import sys
import threading
import time

SIZE = 10 * 1000 * 1000


def serve(addr):
    def banner():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, 7))
        s.listen(128)
        while True:
            c, _ = s.accept()
            try:
                c.sendall(b"x")
            finally:
                c.close()

    def one(c):
        try:
            req = b""
            while b"\r\n\r\n" not in req:
                chunk = c.recv(4096)
                if not chunk:
                    return
                req += chunk
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % SIZE)
            block = b"z" * 65536
            left = SIZE
            while left > 0:
                n = min(left, len(block))
                c.sendall(block[:n])
                left -= n
        finally:
            c.close()

    def http():
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, 80))
        s.listen(64)
        while True:
            c, _ = s.accept()
            threading.Thread(target=one, args=(c,), daemon=True).start()

    threading.Thread(target=banner, daemon=True).start()
    http()


def connect(addr, n):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        s = socket.create_connection((addr, 7), timeout=10)
        if s.recv(1) != b"x":
            sys.exit("no banner byte")
        times.append((time.perf_counter() - t) * 1e6)
        s.close()
    print("%.0f" % statistics.median(times))


def fetch(addr, n):
    rates = []
    for _ in range(n):
        t = time.perf_counter()
        s = socket.create_connection((addr, 80), timeout=30)
        s.sendall(b"GET /10mb HTTP/1.0\r\nHost: %s\r\n\r\n" % addr.encode())
        got = 0
        while True:
            chunk = s.recv(1 << 18)
            if not chunk:
                break
            got += len(chunk)
        s.close()
        if got < SIZE:
            sys.exit("short download: %d bytes" % got)
        rates.append(SIZE / (time.perf_counter() - t) / 1e6)
    print("%.1f" % statistics.median(rates))


def serve_https(logdir, certdir):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "net"))
    import fakenet
    servers = [fakenet.HTTPSAPI(logdir, certdir, name, fakenet.HTTPS_HOSTS[name][0])
               for name in ("api.test", "plain.test")]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    fakenet.dns_server(logdir)()


def https(name, n, cafile, proxy):
    ctx = ssl.create_default_context(cafile=cafile)
    req = (b"GET /bench HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer capsule-bench\r\n"
           b"Connection: close\r\n\r\n" % name.encode())
    times = []
    for _ in range(n):
        t = time.perf_counter()
        if proxy:
            host, port = proxy.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=20)
            s.sendall(b"CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (name.encode(), name.encode()))
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                if not chunk:
                    sys.exit("the proxy closed the CONNECT to %s" % name)
                head += chunk
            if head.split(b" ")[1:2] != [b"200"]:
                sys.exit("the proxy refused %s: %r" % (name, head.split(b"\r\n")[0]))
        else:
            s = socket.create_connection((name, 443), timeout=20)
        t2 = ctx.wrap_socket(s, server_hostname=name)
        t2.sendall(req)
        got = b""
        while True:
            chunk = t2.recv(65536)
            if not chunk:
                break
            got += chunk
        t2.close()
        if not got.startswith(b"HTTP/1.1 200"):
            sys.exit("no answer from %s: %r" % (name, got[:80]))
        times.append((time.perf_counter() - t) * 1e3)
    print("%.2f" % statistics.median(times))


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "serve":
        serve(sys.argv[2])
    elif what == "connect":
        connect(sys.argv[2], int(sys.argv[3]))
    elif what == "fetch":
        fetch(sys.argv[2], int(sys.argv[3]))
    elif what == "serve-https":
        serve_https(sys.argv[2], sys.argv[3])
    elif what == "https":
        https(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
    else:
        sys.exit(__doc__)
