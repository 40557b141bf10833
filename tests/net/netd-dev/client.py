#!/usr/bin/python3
"""The guest's side in the netd dev harness (run in the jail's namespace as
the redirected UID). Prints one line per check.
  client.py http ADDR PORT [PATH]    GET, prints the body's line or ERR ...
  client.py dns NAME                 prints rcode=N addrs=...
  client.py connect TARGET           CONNECT through gateway:3128, echo "hi"
  client.py get URL                  absolute-form GET through the proxy
  client.py tls ADDR PORT SNI        a ClientHello with SNI (Python escapes)
  client.py dnsodd KIND NAME         an odd query (compressed, ancount, edns,
                                     case): prints rcode=N q=QUESTION
  client.py dnstcpqr N               N TCP connections each sending a DNS
                                     message with QR set: prints closed=K/N
  client.py flood N NAME             N queries for NAME, one after another
"""
import socket
import struct
import sys


def recv_all(s):
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except ConnectionResetError:
        out += b"<RST>"
    except socket.timeout:
        out += b"<TIMEOUT>"
    return out


def http(addr, port, path="/"):
    try:
        s = socket.create_connection((addr, int(port)), timeout=5)
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n".encode())
        r = recv_all(s)
        if not r.startswith(b"HTTP/1."):
            print("ERR no answer", r[:60])
            return
        print(r.split(b"\r\n\r\n", 1)[1].decode().strip())
    except OSError as e:
        print("ERR", e)


def query(name):
    q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
    return q + b"".join(bytes([len(x)]) + x.encode() for x in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)


def dns(name):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(8)
    s.sendto(query(name), ("127.0.0.1", 53))
    try:
        m = s.recv(4096)
    except socket.timeout:
        print("ERR timeout")
        return
    show(m)


def dnstcp(*names):
    """Several queries on one connection, sent at once."""
    s = socket.create_connection(("127.0.0.1", 53), timeout=10)
    s.sendall(b"".join(struct.pack(">H", len(query(n))) + query(n) for n in names))
    buf = b""
    for _ in names:
        while len(buf) < 2 or len(buf) < 2 + struct.unpack(">H", buf[:2])[0]:
            d = s.recv(4096)
            if not d:
                print("ERR closed")
                return
            buf += d
        n = struct.unpack(">H", buf[:2])[0]
        show(buf[2:2 + n])
        buf = buf[2 + n:]


def show(m):
    rcode = m[3] & 15
    an = struct.unpack(">H", m[6:8])[0]
    o = 12
    while m[o]:
        o += 1 + m[o]
    o += 5
    addrs = []
    for _ in range(an):
        while True:
            if m[o] & 0xc0 == 0xc0:
                o += 2
                break
            if m[o] == 0:
                o += 1
                break
            o += 1 + m[o]
        t, c, ttl, rl = struct.unpack(">HHIH", m[o:o + 10])
        o += 10
        if t == 1:
            addrs.append(socket.inet_ntoa(m[o:o + 4]))
        o += rl
    print(f"id={struct.unpack('>H', m[:2])[0]:#x} rcode={rcode} addrs={','.join(addrs)}")


def head_of(s):
    r = b""
    while b"\r\n\r\n" not in r:
        d = s.recv(4096)
        if not d:
            break
        r += d
    return r


def connect(target):
    t = target.encode().decode("unicode_escape").encode("latin-1")
    s = socket.create_connection(("127.0.0.1", 3128), timeout=15)
    s.sendall(b"CONNECT " + t + b" HTTP/1.1\r\nHost: " + t + b"\r\n\r\n")
    r = head_of(s)
    status = r.split(b"\r\n")[0].decode(errors="replace")
    if " 200 " not in status:
        body = recv_all(s)
        print(status, "|", (r.split(b"\r\n\r\n", 1)[1] + body).decode(errors="replace").strip())
        return
    s.sendall(b"hi\n")
    print(status, "|", recv_all(s).decode(errors="replace").strip())


def get(url):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=15)
    s.sendall(f"GET {url} HTTP/1.1\r\nHost: wrong.example\r\nProxy-Connection: keep-alive\r\n"
              "Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\n\r\n".encode())
    r = recv_all(s)
    status = r.split(b"\r\n")[0].decode(errors="replace")
    print(status, "|", r.split(b"\r\n\r\n", 1)[-1].decode(errors="replace").strip())


def hello(sni):
    ext_sni = struct.pack(">HHHBH", 0, len(sni) + 5, len(sni) + 3, 0, len(sni)) + sni
    body = b"\x03\x03" + b"\x11" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += struct.pack(">H", len(ext_sni)) + ext_sni
    hs = b"\x01" + struct.pack(">I", len(body))[1:] + body
    return b"\x16\x03\x01" + struct.pack(">H", len(hs)) + hs


def tls(addr, port, sni):
    sni = sni.encode().decode("unicode_escape").encode("latin-1")
    try:
        s = socket.create_connection((addr, int(port)), timeout=5)
        s.sendall(hello(sni))
        r = recv_all(s)
        print("forwarded" if r.startswith(b"echo:") else f"dropped {r[:20]!r}")
    except OSError as e:
        print("dropped", e)


def big(addr):
    import hashlib
    s = socket.create_connection((addr, 80), timeout=20)
    s.sendall(f"GET /big HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n".encode())
    r = recv_all(s)
    body = r.split(b"\r\n\r\n", 1)[1]
    want = hashlib.sha256((bytes(range(256)) * 256) * 160).hexdigest()
    print(f"len={len(body)} {'sha-ok' if hashlib.sha256(body).hexdigest() == want else 'sha-BAD'}")


def upload(addr, port, n):
    s = socket.create_connection((addr, int(port)), timeout=20)
    s.sendall(b"x" * int(n))
    s.shutdown(socket.SHUT_WR)
    print(recv_all(s).decode().strip())


def many(addr, n):
    import concurrent.futures
    def one(i):
        try:
            s = socket.create_connection((addr, 80), timeout=20)
            s.sendall(f"GET /{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return f"path=/{i} " in recv_all(s).decode()
        except OSError:
            return False
    with concurrent.futures.ThreadPoolExecutor(int(n)) as ex:
        ok = sum(ex.map(one, range(int(n))))
    print(f"ok={ok}/{n}")


def dnsodd(kind, name):
    q = query(name)
    if kind == "compressed":
        # The question's name is a pointer to offset 0: read with the
        # guest's ID 0x0161 it is "a.\\000"; with any other ID, something else.
        q = bytes([0x01, 0x61]) + q[2:12] + b"\xc0\x00" + struct.pack(">HH", 1, 1)
    elif kind == "ancount":
        q = q[:6] + struct.pack(">H", 1) + q[8:]
    elif kind == "edns":
        q = q[:10] + struct.pack(">H", 1) + q[12:] + b"\x00\x00\x29\x10\x00\x00\x00\x00\x00\x00\x00"
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(8)
    s.sendto(q, ("127.0.0.1", 53))
    try:
        m = s.recv(4096)
    except socket.timeout:
        print("ERR timeout")
        return
    qd = struct.unpack(">H", m[4:6])[0]
    labels, o = [], 12
    while qd and m[o] and m[o] & 0xc0 == 0:
        labels.append(m[o + 1:o + 1 + m[o]].decode(errors="replace"))
        o += 1 + m[o]
    print(f"id={struct.unpack('>H', m[:2])[0]:#x} rcode={m[3] & 15} q={'.'.join(labels)}")


def dnstcpqr(n):
    import time
    conns = []
    for _ in range(int(n)):
        s = socket.create_connection(("127.0.0.1", 53), timeout=10)
        m = query("allowed.test")
        m = m[:2] + bytes([m[2] | 0x80]) + m[3:]
        s.sendall(struct.pack(">H", len(m)) + m)
        conns.append(s)
    closed = 0
    end = time.time() + 3
    for s in conns:
        s.settimeout(max(0.01, end - time.time()))
        try:
            if s.recv(4096) == b"":
                closed += 1
        except OSError:
            pass
    print(f"closed={closed}/{n}")


def flood(n, name):
    """Each query answered before the next: none lost in a socket buffer."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    answered = 0
    for _ in range(int(n)):
        s.sendto(query(name), ("127.0.0.1", 53))
        try:
            s.recv(4096)
            answered += 1
        except socket.timeout:
            pass
    print(f"answered={answered}/{n}")


cmd = sys.argv[1]
{"dnsodd": dnsodd, "dnstcpqr": dnstcpqr, "flood": flood,
 "http": http, "dns": dns, "dnstcp": dnstcp, "big": big, "upload": upload, "many": many, "connect": connect, "get": get, "tls": tls}[cmd](*sys.argv[2:])
