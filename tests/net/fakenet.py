#!/usr/bin/env python3
"""The fake internet of the network tests (DESIGN §9): servers on addresses
the test chooses, run inside the test's own network namespace, and small
clients to check them. Standard library only.

  fakenet.py serve LOGDIR [CERTDIR]
      Every server below, until SIGTERM/SIGINT. Writes LOGDIR/ready once
      all listen; each server appends one line per event to its log in
      LOGDIR (flushed at once):
        http-ADDR.log      "GET /path host=HOST from SRC"     (port 80)
        tls-ADDR.log       "conn from SRC bytes N first HEX"  (port 443)
        dns.log            "query NAME type T from SRC -> ANSWER"
        proxy.log          "CONNECT TARGET from SRC -> RESULT"
      Servers: HTTP on 203.0.113.10, 203.0.113.11 (allowed), 198.51.100.7
      (denied), 10.1.2.3 (LAN), 169.254.169.254 (metadata), each page
      "hello from ADDR"; a byte recorder on 203.0.113.10:443 and
      203.0.113.11:443 (reads until the peer ends or 1.5 s of silence,
      answers "recorded N bytes", logs what it got); DNS on
      203.0.113.53:53/udp (table below, everything else NXDOMAIN); an HTTP
      CONNECT proxy on 203.0.113.99:3128.
      With CERTDIR (made by "certs"), also HTTPS APIs (HTTP/1.1, keep-alive)
      on port 443 of api.test (203.0.113.20), else.test (203.0.113.21),
      plain.test (203.0.113.23), with certificates of CERTDIR's test CA,
      and untrusted.test (203.0.113.22), whose certificate another CA
      signed. Each logs one
      JSON object a line to https-NAME.log:
        {"event": "request", "conn": C, "seq": K, "from": SRC,
         "line": REQUEST LINE, "headers": [[NAME, VALUE]...], "body": BODY}
      (C counts connections, K requests on one), or "event": "handshake
      failed" with "why" and "first" (the hex of the first bytes the
      client sent, at most 5: "" for none), or "bad request" with "why". Every answer is 200 with a
      Content-Length and no Connection header, so the connection stays
      open for another request: GET /echo answers "auth=AUTHORIZATION";
      /echo-chunked the same in two chunks split inside the value;
      /reflect-encoding answers "ok" with AUTHORIZATION as its
      Content-Encoding (a server that sets headers from what it is sent);
      any other path "hello from NAME PATH conn C seq K".
  fakenet.py certs CERTDIR
      Make, with the openssl command: a test CA (ca.pem, ca.key), another
      one (bad-ca.pem, bad-ca.key), and for each HTTPS name NAME.pem and
      NAME.key (EC P-256; SAN DNS:NAME).
  fakenet.py http LOGDIR ADDR PORT TEXT
      One HTTP server answering TEXT to every GET (a host service),
      logging to LOGDIR/http-ADDR.log as above.
  fakenet.py resolve SERVER NAME
      Ask SERVER (UDP 53) for NAME's A record: prints the addresses, or
      "NXDOMAIN" (exit 3), or "no answer" (exit 1).
  fakenet.py connect ADDR PORT [TIMEOUT]
      Exit 0 if a TCP connection to ADDR:PORT succeeds, else print why and
      exit 1.
  fakenet.py get ADDR PORT [TIMEOUT]
      An HTTP/1.0 GET / to ADDR:PORT: prints the body and exits 0 on a 200
      answer, else prints "cannot get ADDR:PORT: WHY" and exits 1 (a
      connection that is accepted and then closed counts as not reached).
  fakenet.py udp ADDR PORT
      Send one UDP datagram "probe" to ADDR:PORT.
  fakenet.py scan-files NEEDLE... -- PATH...
      Count each NEEDLE in the files under each PATH (sparse files read by
      their data only): prints "needle K: N in F file(s)" and each file
      holding needle K as "needle K in FILE" (the needles themselves are
      never printed).
  fakenet.py scan-memory PID MIN_MIB NEEDLE...
      The same over process PID's memory mappings of at least MIN_MIB MiB
      (a VM's guest RAM), read through /proc/PID/mem: "needle K: N in M
      mapping(s)", and "read B bytes".
  fakenet.py clienthello SNI
      A TLS 1.2 ClientHello naming SNI (Python escapes such as \\r are
      read), printed as a printf(1) format of octal escapes, for a guest
      that has busybox printf but no TLS client.
"""
import json
import os
import select
import ssl
import subprocess
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HTTP_ADDRS = ["203.0.113.10", "203.0.113.11", "198.51.100.7", "10.1.2.3", "169.254.169.254"]
TLS_ADDRS = ["203.0.113.10", "203.0.113.11"]
DNS_ADDR = "203.0.113.53"
PROXY_ADDR = ("203.0.113.99", 3128)
DNS_TABLE = {
    "allowed.test": "203.0.113.10",
    "other.test": "203.0.113.11",
    "rebind.test": "10.1.2.3",
    "meta.test": "169.254.169.254",
    "api.test": "203.0.113.20",
    "else.test": "203.0.113.21",
    "untrusted.test": "203.0.113.22",
    "plain.test": "203.0.113.23",
}
# The HTTPS APIs: name -> (address, whether the test CA signs its
# certificate; else the untrusted one does).
HTTPS_HOSTS = {
    "api.test": ("203.0.113.20", True),
    "else.test": ("203.0.113.21", True),
    "untrusted.test": ("203.0.113.22", False),
    "plain.test": ("203.0.113.23", True),
}

_log_lock = threading.Lock()


def log(logdir, name, line):
    with _log_lock:
        with open(os.path.join(logdir, name), "a") as f:
            f.write(line + "\n")


def http_server(logdir, addr, port, text):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self):
            body = (text + "\n").encode()
            log(logdir, "http-%s.log" % addr, "GET %s host=%s from %s" % (
                self.path, self.headers.get("Host", "-"), self.client_address[0]))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer.daemon_threads = True
    return ThreadingHTTPServer((addr, port), Handler)


class Recorder(socketserver.ThreadingTCPServer):
    """Records what each connection sends; answers how much it got."""
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, logdir, addr, port):
        class Handler(socketserver.BaseRequestHandler):
            def handle(inner):
                s = inner.request
                got = b""
                while True:
                    r, _, _ = select.select([s], [], [], 1.5)
                    if not r:
                        break
                    try:
                        d = s.recv(65536)
                    except OSError:
                        break
                    if not d:
                        break
                    got += d
                log(logdir, "tls-%s.log" % addr, "conn from %s bytes %d first %s" % (
                    inner.client_address[0], len(got), got[:16].hex()))
                try:
                    s.sendall(b"recorded %d bytes\n" % len(got))
                except OSError:
                    pass

        super().__init__((addr, port), Handler)


def openssl(*args):
    r = subprocess.run(("openssl",) + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise SystemExit("openssl %s failed: %s" % (args[0], r.stderr.decode(errors="replace").strip()))


def certs(certdir):
    """A test CA, an untrusted one, and a certificate for each HTTPS name."""
    os.makedirs(certdir, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    for ca, cn in (("ca", "capsule test CA"), ("bad-ca", "an untrusted CA")):
        openssl("req", "-x509", *ec, "-keyout", os.path.join(certdir, ca + ".key"),
                "-out", os.path.join(certdir, ca + ".pem"), "-days", "3", "-subj", "/CN=" + cn,
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, (_, trusted) in HTTPS_HOSTS.items():
        ca = os.path.join(certdir, "ca" if trusted else "bad-ca")
        key, csr, pem = (os.path.join(certdir, name + x) for x in (".key", ".csr", ".pem"))
        ext = os.path.join(certdir, name + ".ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=DNS:%s\nbasicConstraints=CA:FALSE\n"
                    "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n" % name)
        openssl("req", "-new", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=" + name)
        openssl("x509", "-req", "-in", csr, "-CA", ca + ".pem", "-CAkey", ca + ".key",
                "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "3",
                "-extfile", ext, "-out", pem)
        os.unlink(csr)
        os.unlink(ext)


class HTTPSAPI(socketserver.ThreadingTCPServer):
    """A fake HTTPS API: keeps connections open (HTTP/1.1), records every
    request whole, echoes Authorization on /echo."""
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, logdir, certdir, name, addr):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(certdir, name + ".pem"), os.path.join(certdir, name + ".key"))
        counter = {"conns": 0}
        lock = threading.Lock()
        logname = "https-%s.log" % name

        def record(**what):
            log(logdir, logname, json.dumps(what, sort_keys=True))

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 20

            def setup(inner):
                with lock:
                    counter["conns"] += 1
                    inner.conn = counter["conns"]
                inner.seq = 0
                inner.tls = False
                # What came first (at most 5 bytes, left in place), so a
                # failed handshake says whether the client sent anything.
                first = b""
                try:
                    if select.select([inner.request], [], [], 10)[0]:
                        first = inner.request.recv(5, socket.MSG_PEEK)
                    inner.request = ctx.wrap_socket(inner.request, server_side=True)
                    inner.tls = True
                except (ssl.SSLError, OSError) as e:
                    record(event="handshake failed", conn=inner.conn, why=str(e), first=first.hex(),
                           **{"from": inner.client_address[0]})
                super().setup()

            def handle(inner):
                if inner.tls:
                    try:
                        super().handle()
                    except (ssl.SSLError, OSError):
                        pass

            def read_body(inner):
                te = inner.headers.get("Transfer-Encoding", "")
                if te.lower() == "chunked":
                    body = b""
                    while True:
                        size = int(inner.rfile.readline(100).split(b";")[0].strip(), 16)
                        if size == 0:
                            while inner.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                                pass
                            return body
                        body += inner.rfile.read(size)
                        inner.rfile.readline(10)
                n = int(inner.headers.get("Content-Length", "0"))
                return inner.rfile.read(n) if n > 0 else b""

            def answer(inner):
                inner.seq += 1
                try:
                    body = inner.read_body()
                except ValueError as e:
                    record(event="bad request", conn=inner.conn, why="body: %s" % e)
                    inner.close_connection = True
                    return
                record(event="request", conn=inner.conn, seq=inner.seq, line=inner.requestline,
                       headers=[[k, v] for k, v in inner.headers.items()],
                       body=body.decode("latin-1"), **{"from": inner.client_address[0]})
                path = inner.path.split("?")[0]
                auth = inner.headers.get("Authorization", "")
                inner.send_response(200)
                inner.send_header("Content-Type", "text/plain")
                if path == "/echo-chunked":
                    text = ("auth=%s\n" % auth).encode("latin-1")
                    cut = 5 + len(auth) // 2
                    inner.send_header("Transfer-Encoding", "chunked")
                    inner.end_headers()
                    for part in (text[:cut], text[cut:], b""):
                        inner.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    return
                if path == "/reflect-encoding":
                    inner.send_header("Content-Encoding", auth)
                    text = "ok\n"
                elif path == "/echo":
                    text = "auth=%s\n" % auth
                else:
                    text = "hello from %s %s conn %d seq %d\n" % (name, path, inner.conn, inner.seq)
                data = text.encode("latin-1")
                inner.send_header("Content-Length", str(len(data)))
                inner.end_headers()
                if inner.command != "HEAD":
                    inner.wfile.write(data)

            do_GET = do_POST = do_PUT = do_HEAD = answer

            def log_error(inner, fmt, *args):
                record(event="bad request", conn=inner.conn, why=fmt % args)

            def log_message(inner, *args):
                pass

        super().__init__((addr, 443), Handler)


def dns_reply(query, table):
    """The answer to one DNS query (bytes), and what was asked."""
    if len(query) < 12:
        return None, None
    qid, flags, qdcount = struct.unpack("!HHH", query[:6])
    if qdcount != 1 or flags & 0x8000:
        return None, None
    labels, i = [], 12
    while i < len(query) and query[i] != 0:
        n = query[i]
        if n > 63 or i + 1 + n > len(query):
            return None, None
        labels.append(query[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    if i + 5 > len(query):
        return None, None
    qtype, qclass = struct.unpack("!HH", query[i + 1:i + 5])
    question = query[12:i + 5]
    name = ".".join(labels).lower()
    addr = table.get(name)
    rd = flags & 0x0100
    if addr is None:
        head = struct.pack("!HHHHHH", qid, 0x8000 | 0x0400 | rd | 0x0080 | 3, 1, 0, 0, 0)
        return head + question, (name, qtype, "NXDOMAIN")
    answers = b""
    if qtype == 1 and qclass == 1:
        answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + socket.inet_aton(addr)
    head = struct.pack("!HHHHHH", qid, 0x8000 | 0x0400 | rd | 0x0080, 1, 1 if answers else 0, 0, 0)
    return head + question + answers, (name, qtype, addr if answers else "no A asked")


def dns_server(logdir):
    # Bound to the exact address: a UDP server on 0.0.0.0 answers from
    # the route's source address (DESIGN §9).
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((DNS_ADDR, 53))

    def loop():
        while True:
            query, peer = s.recvfrom(4096)
            reply, what = dns_reply(query, DNS_TABLE)
            if reply is None:
                log(logdir, "dns.log", "malformed query from %s" % peer[0])
                continue
            log(logdir, "dns.log", "query %s type %d from %s -> %s" % (what[0], what[1], peer[0], what[2]))
            s.sendto(reply, peer)
    return loop


def relay(a, b):
    socks = [a, b]
    try:
        while True:
            r, _, _ = select.select(socks, [], [], 30)
            if not r:
                return
            for s in r:
                d = s.recv(65536)
                if not d:
                    return
                (b if s is a else a).sendall(d)
    except OSError:
        return


class Proxy(socketserver.ThreadingTCPServer):
    """An upstream HTTP proxy: CONNECT only, each target logged."""
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, logdir):
        class Handler(socketserver.BaseRequestHandler):
            def handle(inner):
                c = inner.request
                c.settimeout(10)
                head = b""
                try:
                    while b"\r\n\r\n" not in head and len(head) < 8192:
                        d = c.recv(4096)
                        if not d:
                            return
                        head += d
                except OSError:
                    return
                head, _, rest = head.partition(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                parts = line.split(" ")
                src = inner.client_address[0]
                if len(parts) != 3 or parts[0] != "CONNECT":
                    log(logdir, "proxy.log", "%r from %s -> 405" % (line, src))
                    c.sendall(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
                    return
                target = parts[1]
                host, _, port = target.rpartition(":")
                try:
                    up = socket.create_connection((host, int(port)), 3)
                except (OSError, ValueError) as e:
                    log(logdir, "proxy.log", "CONNECT %s from %s -> 502 %s" % (target, src, e))
                    c.sendall(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
                    return
                log(logdir, "proxy.log", "CONNECT %s from %s -> 200" % (target, src))
                c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                c.settimeout(None)
                if rest:
                    up.sendall(rest)
                relay(c, up)
                up.close()

        super().__init__(PROXY_ADDR, Handler)


def serve(logdir, certdir=None):
    servers = [http_server(logdir, a, 80, "hello from " + a) for a in HTTP_ADDRS]
    servers += [Recorder(logdir, a, 443) for a in TLS_ADDRS]
    if certdir:
        servers += [HTTPSAPI(logdir, certdir, name, addr) for name, (addr, _) in HTTPS_HOSTS.items()]
    servers.append(Proxy(logdir))
    loops = [s.serve_forever for s in servers] + [dns_server(logdir)]
    for f in loops:
        threading.Thread(target=f, daemon=True).start()
    with open(os.path.join(logdir, "ready"), "w") as f:
        f.write("%d\n" % os.getpid())
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


def resolve(server, name):
    q = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\x00" + struct.pack("!HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    try:
        s.sendto(q, (server, 53))
        r = s.recv(4096)
    except OSError as e:
        print("no answer: %s" % e)
        return 1
    if len(r) < 12 or r[:2] != q[:2]:
        print("no answer: malformed reply")
        return 1
    if r[3] & 0x0f == 3:
        print("NXDOMAIN")
        return 3
    ancount = struct.unpack("!H", r[6:8])[0]
    i = len(q)
    addrs = []
    for _ in range(ancount):
        if r[i] & 0xc0 == 0xc0:
            i += 2
        else:
            while r[i]:
                i += 1 + r[i]
            i += 1
        rtype, _, _, rdlen = struct.unpack("!HHIH", r[i:i + 10])
        i += 10
        if rtype == 1 and rdlen == 4:
            addrs.append(socket.inet_ntoa(r[i:i + 4]))
        i += rdlen
    if not addrs:
        print("no answer")
        return 1
    print(" ".join(addrs))
    return 0


def get(addr, port, timeout):
    try:
        s = socket.create_connection((addr, port), timeout)
        s.sendall(b"GET / HTTP/1.0\r\nHost: %s\r\n\r\n" % addr.encode())
        got = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
    except OSError as e:
        print("cannot get %s:%d: %s" % (addr, port, e))
        return 1
    head, _, body = got.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    if not status.startswith("HTTP/1.") or status.split(" ")[1:2] != ["200"]:
        print("cannot get %s:%d: answer %r" % (addr, port, status or "none (closed)"))
        return 1
    sys.stdout.write(body.decode("latin-1"))
    return 0


def clienthello(sni):
    name = sni.encode("latin-1")
    server_name = b"\x00" + struct.pack("!H", len(name)) + name
    sni_ext = struct.pack("!HH", 0, len(server_name) + 2) + struct.pack("!H", len(server_name)) + server_name
    body = (b"\x03\x03" + bytes(range(32)) + b"\x00"            # version, random, no session
            + struct.pack("!H", 4) + b"\xc0\x2f\x00\x2f"          # two cipher suites
            + b"\x01\x00"                                         # null compression
            + struct.pack("!H", len(sni_ext)) + sni_ext)
    hs = b"\x01" + struct.pack("!I", len(body))[1:] + body
    record = b"\x16\x03\x01" + struct.pack("!H", len(hs)) + hs
    return "".join("\\%03o" % b for b in record)


def count_in(read, needles, state):
    """Feed chunks from read() into per-needle counts; state carries the
    tail so that a needle across two chunks is found."""
    keep = max(len(n) for n in needles) - 1
    found = [0] * len(needles)
    tail = b""
    total = 0
    while True:
        chunk = read()
        if not chunk:
            break
        total += len(chunk)
        data = tail + chunk
        for i, n in enumerate(needles):
            # Only matches ending in the new chunk: the tail's own were counted.
            start = 0
            while True:
                k = data.find(n, start)
                if k < 0:
                    break
                if k + len(n) > len(tail):
                    found[i] += 1
                start = k + 1
        tail = data[-keep:] if keep else b""
    state["bytes"] = state.get("bytes", 0) + total
    return found


def data_chunks(f, size=1 << 20):
    """The data regions of an open file, chunk by chunk, holes skipped."""
    fd = f.fileno()
    end = os.fstat(fd).st_size
    pos = 0
    while pos < end:
        try:
            pos = os.lseek(fd, pos, os.SEEK_DATA)
            hole = os.lseek(fd, pos, os.SEEK_HOLE)
        except OSError:
            return
        while pos < hole:
            b = os.pread(fd, min(size, hole - pos), pos)
            if not b:
                return
            pos += len(b)
            yield b


def scan_files(needles, paths):
    files = []
    for p in paths:
        if os.path.isdir(p):
            for d, _, names in os.walk(p):
                files += [os.path.join(d, n) for n in names]
        else:
            files.append(p)
    totals = [0] * len(needles)
    holders = [[] for _ in needles]
    state = {}
    for path in sorted(files):
        try:
            with open(path, "rb") as f:
                it = data_chunks(f)
                found = count_in(lambda: next(it, b""), needles, state)
        except OSError:
            continue
        for i, c in enumerate(found):
            totals[i] += c
            if c:
                holders[i].append(path)
    for i in range(len(needles)):
        print("needle %d: %d in %d file(s)" % (i + 1, totals[i], len(holders[i])))
        for h in holders[i]:
            print("needle %d in %s" % (i + 1, h))
    print("read %d bytes of %d files" % (state.get("bytes", 0), len(files)))
    return 0


def scan_memory(pid, min_mib, needles):
    maps = []
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if hi - lo >= min_mib << 20 and line.split()[1].startswith("r"):
                maps.append((lo, hi))
    totals = [0] * len(needles)
    state = {}
    with open("/proc/%d/mem" % pid, "rb", buffering=0) as mem:
        for lo, hi in maps:
            pos = [lo]

            def read():
                if pos[0] >= hi:
                    return b""
                n = min(1 << 20, hi - pos[0])
                try:
                    b = os.pread(mem.fileno(), n, pos[0])
                except OSError:
                    b = b"\0" * n	# a page that cannot be read: counted as empty
                pos[0] += n
                return b
            for i, c in enumerate(count_in(read, needles, state)):
                totals[i] += c
    for i in range(len(needles)):
        print("needle %d: %d in %d mapping(s)" % (i + 1, totals[i], len(maps)))
    print("read %d bytes" % state.get("bytes", 0))
    return 0 if maps else 1


def main(argv):
    if len(argv) in (3, 4) and argv[1] == "serve":
        serve(argv[2], argv[3] if len(argv) == 4 else None)
        return 0
    if len(argv) == 3 and argv[1] == "certs":
        certs(argv[2])
        return 0
    if len(argv) == 6 and argv[1] == "http":
        http_server(argv[2], argv[3], int(argv[4]), argv[5]).serve_forever()
        return 0
    if len(argv) == 4 and argv[1] == "resolve":
        return resolve(argv[2], argv[3])
    if len(argv) in (4, 5) and argv[1] == "connect":
        try:
            socket.create_connection((argv[2], int(argv[3])), float(argv[4]) if len(argv) == 5 else 3).close()
        except OSError as e:
            print("cannot connect to %s:%s: %s" % (argv[2], argv[3], e))
            return 1
        return 0
    if len(argv) in (4, 5) and argv[1] == "get":
        return get(argv[2], int(argv[3]), float(argv[4]) if len(argv) == 5 else 3)
    if len(argv) == 4 and argv[1] == "udp":
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"probe\n", (argv[2], int(argv[3])))
        return 0
    if len(argv) >= 5 and argv[1] == "scan-files" and "--" in argv[3:]:
        k = argv.index("--", 2)
        return scan_files([n.encode() for n in argv[2:k]], argv[k + 1:])
    if len(argv) >= 5 and argv[1] == "scan-memory":
        return scan_memory(int(argv[2]), int(argv[3]), [n.encode() for n in argv[4:]])
    if len(argv) == 3 and argv[1] == "clienthello":
        print(clienthello(argv[2].encode("latin-1").decode("unicode_escape")))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
