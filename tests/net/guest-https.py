"""The guest's HTTPS client of the secrets tests (tests/integration/
test-secret.sh). It runs in the python image, whose python3-minimal has
socket and ssl but not http.client, so HTTP is spoken by hand here.

  guest-https.py [--direct] [--pipeline] [--cafile FILE] HOST REQUEST...
      One TLS connection to HOST:443: through $HTTPS_PROXY by CONNECT when
      it is set, or straight to HOST with --direct. The server's
      certificate is verified by ssl.create_default_context() (which
      honours SSL_CERT_FILE), or against FILE only. Then each REQUEST (the
      raw request, Python escapes such as \\r\\n read) goes on that one
      connection, each response read whole (Content-Length, chunked, or
      to the end) before the next request, as keep-alive clients do; with
      --pipeline all requests are sent first. Prints:
        issuer: CN            the verified certificate's issuer
        --- response K        then that response as received, head and body
        --- closed before response K
        --- send K failed: WHY
      Exits 0 once the handshake succeeded, else prints "proxy said: ...",
      "tls failed: ..." or "connect failed: ..." and exits 1.
  guest-https.py raw ADDR PORT BYTES
      Send BYTES (Python escapes, octal ones such as \\026 too, as
      fakenet.py clienthello prints them) to ADDR:PORT and print what comes
      back until the peer closes or 5 s pass, then "--- closed" or
      "--- timeout".
"""
import os
import socket
import ssl
import sys
from urllib.parse import urlsplit


def unescape(text):
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1")


def read_head(s, buf):
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            return None, buf
        buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def read_response(s, buf, head_request):
    """One response from s: (its bytes, bytes after it), or (None, partial)
    when the connection ended first."""
    head, buf = read_head(s, buf)
    if head is None:
        return None, buf
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ")
    headers = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        headers[k.strip().lower()] = v.strip()
    code = int(status[1]) if len(status) > 1 and status[1].isdigit() else 0
    if head_request or code in (204, 304) or 100 <= code < 200:
        return head, buf
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            while b"\r\n" not in buf:
                d = s.recv(65536)
                if not d:
                    return head + body + buf, b""
                buf += d
            line, _, buf = buf.partition(b"\r\n")
            size = int(line.split(b";")[0].strip() or b"0", 16)
            while len(buf) < size + 2:
                d = s.recv(65536)
                if not d:
                    return head + body + line + b"\r\n" + buf, b""
                buf += d
            body += line + b"\r\n" + buf[:size + 2]
            buf = buf[size + 2:]
            if size == 0:
                return head + body, buf
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(buf) < n:
            d = s.recv(65536)
            if not d:
                break
            buf += d
        return head + buf[:n], buf[n:]
    while True:
        d = s.recv(65536)
        if not d:
            return head + buf, b""
        buf += d


def open_tls(host, direct, cafile):
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    try:
        if proxy and not direct:
            u = urlsplit(proxy)
            s = socket.create_connection((u.hostname, u.port or 80), 20)
            s.sendall(b"CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (host.encode(), host.encode()))
            head, rest = read_head(s, b"")
            first = head.split(b"\r\n", 1)[0] if head else b"(closed)"
            if not head or first.split(b" ")[1:2] != [b"200"] or rest:
                print("proxy said: %s" % first.decode("latin-1"))
                return None
        else:
            s = socket.create_connection((host, 443), 20)
    except OSError as e:
        print("connect failed: %s" % e)
        return None
    ctx = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    try:
        t = ctx.wrap_socket(s, server_hostname=host)
    except (ssl.SSLError, OSError) as e:
        print("tls failed: %s" % e)
        return None
    issuer = dict(x[0] for x in t.getpeercert()["issuer"])
    print("issuer: %s" % issuer.get("commonName", "?"))
    return t


def exchange(argv):
    direct = pipeline = False
    cafile = None
    while argv and argv[0].startswith("--"):
        if argv[0] == "--direct":
            direct = True
        elif argv[0] == "--pipeline":
            pipeline = True
        elif argv[0] == "--cafile" and len(argv) > 1:
            cafile = argv[1]
            argv = argv[1:]
        else:
            sys.exit(__doc__)
        argv = argv[1:]
    if len(argv) < 2:
        sys.exit(__doc__)
    t = open_tls(argv[0], direct, cafile)
    if t is None:
        return 1
    reqs = [unescape(r) for r in argv[1:]]
    heads = [r.startswith(b"HEAD ") for r in reqs]
    buf = b""
    if pipeline:
        try:
            t.sendall(b"".join(reqs))
        except OSError as e:
            print("--- send 1 failed: %s" % e)
            return 0
    for k, req in enumerate(reqs, 1):
        if not pipeline:
            try:
                t.sendall(req)
            except OSError as e:
                print("--- send %d failed: %s" % (k, e))
                return 0
        try:
            resp, buf = read_response(t, buf, heads[k - 1])
        except (OSError, ValueError) as e:
            print("--- closed before response %d: %s" % (k, e))
            return 0
        if resp is None:
            print("--- closed before response %d" % k)
            return 0
        print("--- response %d" % k)
        sys.stdout.write(resp.decode("latin-1").replace("\r\n", "\n"))
        if not resp.endswith(b"\n"):
            print()
    return 0


def raw(addr, port, data):
    try:
        s = socket.create_connection((addr, port), 10)
        s.sendall(unescape(data))
        s.settimeout(5)
        while True:
            d = s.recv(65536)
            if not d:
                print("--- closed")
                return 0
            sys.stdout.write(d.decode("latin-1"))
    except socket.timeout:
        print("--- timeout")
    except OSError as e:
        print("--- error: %s" % e)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "raw":
        sys.exit(raw(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
    sys.exit(exchange(sys.argv[1:]))
