#!/usr/bin/env python3
"""Network figures for make bench (row (j)), standard library only.

  bench-net.py serve ADDR         a server on ADDR: port 7 sends one byte on
                                  accept; port 80 answers GET /10mb with 10 MB
  bench-net.py connect ADDR N     N connects to ADDR:7, each to its first byte;
                                  prints the median in microseconds
  bench-net.py fetch ADDR N       N downloads of ADDR:80/10mb; prints the
                                  median MB/s
"""
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


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "serve":
        serve(sys.argv[2])
    elif what == "connect":
        connect(sys.argv[2], int(sys.argv[3]))
    elif what == "fetch":
        fetch(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
