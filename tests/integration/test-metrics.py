#!/usr/bin/env python3
"""`capsule serve --metrics ADDR` (docs/serve.md, "Metrics"), black-box:
serve on a loopback port with a network policy (the host's loopback
open), calls of every outcome (one that fails, a VM exec that reaches a
host HTTP server and one that is refused), then /metrics scraped and
PARSED by a strict parser of the text format 0.0.4 written here (every
sample's metric has HELP and TYPE, names and label syntax and escaping,
counters end in _total, histogram buckets cumulative and monotone with
+Inf == _count, no duplicate series, families contiguous), and checked:
calls by method and outcome exactly as this suite made them, latencies,
sandboxes by state through a pause, evictions, the policy process's
refusals (== its net.log's refusal lines) and bytes (>= the page it
fetched), memory held. The endpoint's HTTP: 404, 405, 400, 431, HEAD, a
client that sends nothing answered 408 and closed without stalling a
concurrent JSON-RPC call, the 17th connection at once answered 503. Then a
unix socket (and [::1] where the host has IPv6 loopback), bad addresses
and one in use refused naming them. With Debian's prometheus_client
(python3-prometheus-client) the text is parsed by it too. TAP output;
every wait is bounded."""
import http.server
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from servelib import Connection, Home, Server, Tap, call  # noqa: E402

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    text_string_to_metric_families = None

CAPSULE = os.path.abspath(sys.argv[1])
H = Home("cmet.")
T = Tap()
ok, elapsed, log_tail = T.ok, T.elapsed, H.log_tail
PLAN = 45
PAGE = 48 * 1024 + 7   # what the host's HTTP server answers
OUTCOME = {-32700: "parse_error", -32600: "invalid_request", -32601: "method_not_found",
           -32602: "invalid_params", -32603: "internal_error", -32000: "sandbox_error",
           -32001: "capacity", -32002: "tool_error", -32800: "cancelled"}
CTYPE = "text/plain; version=0.0.4; charset=utf-8"
server = None
made = {}   # (method, outcome) -> calls this suite made


# --- the strict parser of the text format 0.0.4 ----------------------------------

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class Bad(Exception):
    pass


def parse_labels(s, i, line):
    """The label set at s[i] == '{': ({name: value}, index after '}')."""
    labels = {}
    i += 1
    while True:
        if s[i] == "}":
            return labels, i + 1
        m = LABEL.match(s, i)
        if not m:
            raise Bad(f"bad label name at {i}: {line!r}")
        name = m.group(0)
        if name.startswith("__"):
            raise Bad(f"reserved label name {name}: {line!r}")
        i = m.end()
        if s[i:i + 2] != '="':
            raise Bad(f"label {name} without =\": {line!r}")
        i += 2
        v = []
        while True:
            if i >= len(s):
                raise Bad(f"unterminated label value: {line!r}")
            c = s[i]
            if c == "\\":
                nxt = s[i + 1:i + 2]
                if nxt not in ("\\", '"', "n"):
                    raise Bad(f"bad escape \\{nxt} in a label value: {line!r}")
                v.append("\n" if nxt == "n" else nxt)
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == "\n":
                raise Bad(f"raw newline in a label value: {line!r}")
            else:
                v.append(c)
                i += 1
        if name in labels:
            raise Bad(f"label {name} twice: {line!r}")
        labels[name] = "".join(v)
        if s[i] == ",":
            i += 1
            if s[i] == "}":
                return labels, i + 1   # a trailing comma is allowed
        elif s[i] != "}":
            raise Bad(f"expected , or }} after label {name}: {line!r}")


def parse_value(v, line):
    if v in ("+Inf", "-Inf", "NaN"):
        return float(v.replace("Inf", "inf").replace("NaN", "nan"))
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", v):
        raise Bad(f"bad value {v!r}: {line!r}")
    return float(v)


def parse(text):
    """{family: {"type", "help", "samples": [(name, labels, value)]}}, or Bad."""
    if not text.endswith("\n"):
        raise Bad("the text does not end with a newline")
    fams, order, series = {}, [], set()
    current = None
    for line in text.split("\n")[:-1]:
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                raise Bad(f"a comment that is neither HELP nor TYPE: {line!r}")
            kind, name = parts[1], parts[2]
            if not NAME.fullmatch(name):
                raise Bad(f"bad metric name {name!r}")
            f = fams.setdefault(name, {"type": None, "help": None, "samples": []})
            if f["samples"]:
                raise Bad(f"{kind} of {name} after its samples")
            if kind == "HELP":
                if f["help"] is not None:
                    raise Bad(f"two HELP lines for {name}")
                f["help"] = parts[3] if len(parts) > 3 else ""
                if re.search(r"\\[^\\n]", f["help"]):
                    raise Bad(f"bad escape in the HELP of {name}")
            else:
                if f["type"] is not None:
                    raise Bad(f"two TYPE lines for {name}")
                if len(parts) != 4 or parts[3] not in ("counter", "gauge", "histogram", "summary", "untyped"):
                    raise Bad(f"bad TYPE line {line!r}")
                f["type"] = parts[3]
            if name not in order:
                order.append(name)
            current = name
            continue
        if not line:
            raise Bad("an empty line")
        m = NAME.match(line)
        if not m:
            raise Bad(f"a sample without a metric name: {line!r}")
        name, i = m.group(0), m.end()
        labels = {}
        if i < len(line) and line[i] == "{":
            labels, i = parse_labels(line, i, line)
        rest = line[i:]
        if not rest.startswith(" "):
            raise Bad(f"no space before the value: {line!r}")
        fields = rest[1:].split(" ")
        if len(fields) not in (1, 2) or (len(fields) == 2 and not re.fullmatch(r"-?\d+", fields[1])):
            raise Bad(f"bad value or timestamp: {line!r}")
        value = parse_value(fields[0], line)
        fam = None
        for cand in (name, re.sub(r"_(bucket|sum|count)$", "", name)):
            if cand in fams:
                fam = cand
                break
        if fam is None or fams[fam]["type"] is None or fams[fam]["help"] is None:
            raise Bad(f"sample {name} without HELP and TYPE before it")
        if fam != current:
            raise Bad(f"sample {name} outside its family's block (families interleaved)")
        t = fams[fam]["type"]
        if t == "histogram":
            if name == fam:
                raise Bad(f"a histogram sample named as its family: {line!r}")
            if name.endswith("_bucket") and "le" not in labels:
                raise Bad(f"a bucket without le: {line!r}")
        elif name != fam:
            raise Bad(f"a {t} sample named {name} in family {fam}")
        if t == "counter" and not fam.endswith("_total"):
            raise Bad(f"counter {fam} does not end in _total")
        if t == "counter" and value < 0:
            raise Bad(f"negative counter: {line!r}")
        key = (name, tuple(sorted(labels.items())))
        if key in series:
            raise Bad(f"duplicate series {key}")
        series.add(key)
        fams[fam]["samples"].append((name, labels, value))
    for name, f in fams.items():
        if f["type"] is None or f["help"] is None:
            raise Bad(f"{name} lacks HELP or TYPE")
        if f["type"] == "histogram":
            check_histogram(name, f["samples"])
    return fams


def check_histogram(fam, samples):
    groups = {}
    for name, labels, value in samples:
        rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
        g = groups.setdefault(rest, {"buckets": [], "sum": None, "count": None})
        if name == fam + "_bucket":
            g["buckets"].append((parse_value(labels["le"], name), value))
        elif name == fam + "_sum":
            g["sum"] = value
        elif name == fam + "_count":
            g["count"] = value
        else:
            raise Bad(f"histogram {fam} has sample {name}")
    for rest, g in groups.items():
        b = g["buckets"]
        if g["sum"] is None or g["count"] is None or not b:
            raise Bad(f"histogram {fam}{dict(rest)} lacks _bucket, _sum or _count")
        les = [le for le, _ in b]
        if les != sorted(les) or len(set(les)) != len(les):
            raise Bad(f"histogram {fam}{dict(rest)}: le not ascending: {les}")
        if les[-1] != float("inf"):
            raise Bad(f"histogram {fam}{dict(rest)}: no +Inf bucket")
        counts = [v for _, v in b]
        if any(x > y for x, y in zip(counts, counts[1:])):
            raise Bad(f"histogram {fam}{dict(rest)}: buckets not cumulative: {counts}")
        if counts[-1] != g["count"]:
            raise Bad(f"histogram {fam}{dict(rest)}: +Inf {counts[-1]} != _count {g['count']}")


def value(fams, fam, name=None, **labels):
    """The value of one sample (None when absent)."""
    for n, l, v in fams.get(fam, {}).get("samples", []):
        if n == (name or fam) and l == labels:
            return v
    return None


# --- HTTP ------------------------------------------------------------------------

def connect(addr):
    if isinstance(addr, str):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        s = socket.socket(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(addr)
    return s


def exchange(addr, data, shut=True):
    """Send data, read to the end: (status, {header: value}, body), or
    (None, {}, raw) when the answer is not HTTP."""
    s = connect(addr)
    try:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        raw = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            raw += chunk
    finally:
        s.close()
    return split_answer(raw)


def split_answer(raw):
    head, sep, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    m = re.fullmatch(r"HTTP/1\.1 (\d{3}) .*", lines[0]) if sep else None
    if not m:
        return None, {}, raw
    hdrs = {}
    for h in lines[1:]:
        k, _, v = h.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return int(m.group(1)), hdrs, body


def scrape(addr):
    status, hdrs, body = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: test\r\nAccept: text/plain\r\n\r\n")
    return status, hdrs, body.decode("utf-8", "replace")


def scrape_parsed(addr, what):
    """Scrape, check the answer and parse it strictly: fams or None (a
    failed check said why)."""
    status, hdrs, text = scrape(addr)
    good = status == 200 and hdrs.get("content-type") == CTYPE and \
        int(hdrs.get("content-length", -1)) == len(text.encode())
    try:
        fams = parse(text) if good else None
        why = ""
    except Bad as e:
        fams, why = None, str(e)
    ok(fams is not None, f"{what}: 200, {CTYPE}, and the text parses strictly", f"{status} {hdrs} {why}\n{text[:1500]}")
    return fams, text


# --- JSON-RPC, counted ----------------------------------------------------------

def rpc(c, method, params=None, timeout=None):
    r = call(c, method, params, timeout)
    if "result" in r:
        out = "ok"
    elif "error" in r:
        out = OUTCOME.get(r["error"].get("code"), "internal_error")
    else:
        return r   # no answer: counted by nothing
    made[(method, out)] = made.get((method, out), 0) + 1
    return r


def calls_seen(fams):
    return {(l["method"], l["outcome"]): int(v) for n, l, v in fams["capsule_calls_total"]["samples"] if v}


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(PAGE))
        self.end_headers()
        self.wfile.write(b"x" * PAGE)

    def log_message(self, *a):
        pass


def serve_fails(*args):
    """capsule serve ARGS that must fail at once: (exit code, stderr)."""
    p = subprocess.run([CAPSULE, "serve", "--socket", os.path.join(H.rt, "bad.sock"), *args], env=H.env,
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr


def metrics_addr(log_from):
    """Where the server's log says it serves the metrics."""
    deadline = time.time() + 10
    while time.time() < deadline:
        with open(H.log, errors="replace") as f:
            f.seek(log_from)
            m = re.search(r"metrics on (\S+) \(GET /metrics\)", f.read())
        if m:
            return m.group(1)
        time.sleep(0.05)
    return None


def as_addr(s):
    if s.startswith("/"):
        return s
    host, _, port = s.rpartition(":")
    return (host.strip("[]"), int(port))


print(f"1..{PLAN}", flush=True)
httpd = None
try:
    subprocess.run([CAPSULE, "image", "build", "base"], env=H.env, capture_output=True, check=True)

    # --- bad addresses, refused at once, naming the value ---
    for bad in ("foo", "127.0.0.1", "127.0.0.1:99999", ":9100", "[::1]", "::1:9100", "no-such-host.invalid:9100"):
        rc, err = serve_fails("--metrics", bad)
        ok(rc != 0 and bad in err and "127.0.0.1:PORT" in err and "unix socket" in err,
           f"--metrics {bad!r} is refused naming it and the accepted forms", f"exit {rc}: {err}")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    addr = f"127.0.0.1:{taken.getsockname()[1]}"
    rc, err = serve_fails("--metrics", addr)
    ok(rc != 0 and addr in err and "in use" in err, "an address in use is refused naming it", f"exit {rc}: {err}")
    taken.close()
    plain = os.path.join(H.rt, "plain-file")
    open(plain, "w").close()
    rc, err = serve_fails("--metrics", plain)
    ok(rc != 0 and plain in err and "not a socket" in err and os.path.exists(plain),
       "a path that is a regular file is refused and left alone", f"exit {rc}: {err}")
    rc, err = serve_fails("--metrics", os.path.join(H.rt, "bad.sock"))
    ok(rc != 0 and "JSON-RPC socket" in err, "the JSON-RPC socket's own path is refused", f"exit {rc}: {err}")

    # --- a loopback port, with the host's loopback open to the guest ---
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    page_port = httpd.server_address[1]
    server = Server(CAPSULE, H, "--metrics", "127.0.0.1:0", "--test-clock", "--allow-host")
    a = metrics_addr(0)
    ok(a and re.fullmatch(r"127\.0\.0\.1:\d+", a) and not a.endswith(":0"),
       "the log names the port chosen for 127.0.0.1:0", log_tail())
    A = as_addr(a)
    c = Connection(H.sock, timeout=600)

    fams, _ = scrape_parsed(A, "a scrape before any call")
    info = fams["capsule_build_info"]["samples"] if fams else []
    ok(fams is not None and not fams["capsule_calls_total"]["samples"] and
       value(fams, "capsule_sandboxes", state="running") == 0 and
       len(info) == 1 and info[0][2] == 1 and info[0][1].get("version"),
       "before any call: no call series, no sandbox running, build_info 1 with a version",
       fams and [fams.get("capsule_calls_total"), info])

    r = rpc(c, "prepare", timeout=900)
    ok("result" in r, "prepare", r)
    who = {"agent": "metrics", "peer": "p1"}
    r = rpc(c, "exec", {"identity": who, "argv": ["sh", "-c", "echo hi"]})
    ok(r.get("result", {}).get("stdout") == "hi\n", "a first exec creates the sandbox", f"{r}\n{log_tail()}")
    name = r.get("result", {}).get("sandbox", "")
    durations = [r.get("result", {}).get("duration_ms", 0)]
    r = rpc(c, "exec", {"identity": who, "argv": ["sh", "-c",
            f"wget -Y off -q -O- http://host.capsule.internal:{page_port}/ | wc -c; "
            "echo x | nc -w 3 198.51.100.7 80 >/dev/null 2>&1; echo tcp=$?; "
            "nslookup evil.example >/dev/null 2>&1; echo dns=$?"]})
    out = r.get("result", {}).get("stdout", "")
    ok(out.split() == [str(PAGE), "tcp=1", "dns=1"],
       "the guest fetched the host's page and was refused 198.51.100.7 and the name evil.example", f"{r}")
    durations.append(r.get("result", {}).get("duration_ms", 0))
    r = rpc(c, "exec", {"identity": who})   # no argv
    ok(r.get("error", {}).get("code") == -32602, "an exec without argv fails (invalid params)", r)
    r = rpc(c, "read_file", {"identity": who, "path": "no/such/file", "root": "workspace"})
    ok("error" in r, "a read of a missing file fails", r)
    rpc(c, "status", {"identity": who})
    rpc(c, "info")
    # image_check is answered from its own thread: counted when answered.
    r = rpc(c, "image_check", {"ref": "127.0.0.1:1/none:latest", "timeout": 3}, timeout=30)
    ok(r.get("error", {}).get("data", {}).get("reason") == "offline", "an image_check of a registry that is not there fails (offline)", r)
    c.send_raw(b"this is not json\n")
    c.send_raw(b'{"jsonrpc": "2.0", "id": 99, "result": 1}\n')
    r1, r2 = c.read(), c.read()
    r = call(c, "no.such.method")
    ok(r1.get("error", {}).get("code") == -32700 and r2.get("error", {}).get("code") == -32600 and
       r.get("error", {}).get("code") == -32601, "garbage, a response and an unknown method are refused", [r1, r2, r])

    fams, text = scrape_parsed(A, "a scrape after the calls")
    seen = calls_seen(fams) if fams else {}
    ok(seen == made, "capsule_calls_total: every method and outcome counted exactly as made",
       f"made {sorted(made.items())}\nseen {sorted(seen.items())}")
    counts = {l["method"]: v for n, l, v in fams["capsule_call_duration_seconds"]["samples"]
              if n.endswith("_count")} if fams else {}
    per_method = {}
    for (m, _), k in made.items():
        per_method[m] = per_method.get(m, 0) + k
    ok(counts == per_method, "capsule_call_duration_seconds_count per method == its calls",
       f"{counts} vs {per_method}")
    esum = value(fams, "capsule_call_duration_seconds", "capsule_call_duration_seconds_sum", method="exec") if fams else None
    ok(esum is not None and esum >= sum(durations) / 1000.0 - 0.01,
       "exec's latency sum covers the guest's durations", f"{esum} vs {durations}")
    rej = {l["reason"]: v for n, l, v in fams["capsule_rpc_rejected_total"]["samples"]} if fams else {}
    ok(rej == {"parse_error": 1, "invalid_request": 1, "method_not_found": 1, "shutting_down": 0},
       "capsule_rpc_rejected_total by reason", rej)
    ok(fams and value(fams, "capsule_sandboxes", state="running") == 1 and
       sum(v for n, l, v in fams["capsule_sandboxes"]["samples"]) == 1 and
       value(fams, "capsule_identities") == 1,
       "capsule_sandboxes: one running, one identity", fams and fams["capsule_sandboxes"])
    ok(fams and value(fams, "capsule_prepares_total", outcome="ok") == 1 and
       value(fams, "capsule_prepares_total", outcome="failed") == 0, "capsule_prepares_total: one ok",
       fams and fams["capsule_prepares_total"])
    held = value(fams, "capsule_memory_held_bytes") if fams else None
    ok(held and held > 16 * 2**20 and value(fams, "capsule_memory_held_sandboxes") == 1,
       "capsule_memory_held_bytes: over 16 MiB, for one sandbox", held)
    try:
        with open(os.path.join(H.home, "sandboxes", name, "net.log"), errors="replace") as f:
            lines = [ln for ln in f if re.match(r"capsule net: (refused|dropped) ", ln)]
    except OSError as e:
        lines = [repr(e)]
    refused = value(fams, "capsule_network_refusals_total") if fams else None
    ok(refused and refused >= 1 and refused == len(lines),
       "capsule_network_refusals_total == the refusal lines of the sandbox's net.log", f"{refused} vs {lines}")
    bin_ = value(fams, "capsule_network_bytes_total", direction="in") if fams else None
    bout = value(fams, "capsule_network_bytes_total", direction="out") if fams else None
    ok(bin_ and bin_ >= PAGE and bout and 0 < bout < PAGE,
       "capsule_network_bytes_total: in >= the page fetched, out > 0", f"in {bin_} out {bout}")
    if text_string_to_metric_families:
        try:
            names = {f.name for f in text_string_to_metric_families(text)}
            why = ""
        except Exception as e:
            names, why = set(), repr(e)
        ok("capsule_call_duration_seconds" in names and "capsule_calls" in names,
           "prometheus_client parses the text too", f"{why} {sorted(names)}")
    else:
        print(f"ok {T.n + 1} - prometheus_client parses the text too # SKIP python3-prometheus-client absent",
              flush=True)
        T.n += 1

    # --- the lifecycle moves the gauges ---
    rpc(c, "_test.advance", {"ms": 31000})
    deadline, st = time.time() + 60, None
    while time.time() < deadline:
        st = rpc(c, "status", {"identity": who}).get("result", {}).get("state")
        if st == "paused":
            break
        time.sleep(0.1)
    fams, _ = scrape_parsed(A, "a scrape after the idle pause")
    ok(fams and st == "paused" and value(fams, "capsule_sandboxes", state="paused") == 1 and
       value(fams, "capsule_sandboxes", state="running") == 0 and
       value(fams, "capsule_evictions_total", reason="idle_pause") == 1 and
       value(fams, "capsule_evictions_total", reason="capacity") == 0,
       "after idle_pause: one paused, none running, evictions{idle_pause} 1",
       fams and [fams["capsule_sandboxes"], fams["capsule_evictions_total"]])
    ok(fams and calls_seen(fams) == made, "the calls since counted exactly too", fams and calls_seen(fams))

    # --- the endpoint's HTTP ---
    st404 = exchange(A, b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")[0]
    st405, h405, _ = exchange(A, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    st400 = exchange(A, b"GARBAGE\r\n\r\n")[0]
    st400b = exchange(A, b"GET /metrics HTTP/1.1\r\n\r\n")[0]   # no Host
    st431 = exchange(A, b"GET /metrics HTTP/1.1\r\nX-Long: " + b"a" * 9000)[0]
    ok((st404, st405, h405.get("allow"), st400, st400b, st431) == (404, 405, "GET, HEAD", 400, 400, 431),
       "404 another path, 405 (Allow: GET, HEAD) another method, 400 malformed or no Host, 431 a head over 8 KiB",
       (st404, st405, h405, st400, st400b, st431))
    sh, hh, bh = exchange(A, b"HEAD /metrics HTTP/1.0\r\n\r\n")
    ok(sh == 200 and hh.get("content-type") == CTYPE and int(hh.get("content-length", 0)) > 1000 and bh == b"",
       "HEAD: the headers of the answer, no body", (sh, hh, bh[:100]))

    idle = connect(A)
    idle.sendall(b"GET /metrics HTTP/1.1\r\n")   # and nothing more
    silent = connect(A)                           # nothing at all
    t0 = time.time()
    r = rpc(c, "status", {"identity": who}, timeout=10)
    took = time.time() - t0
    s2, _, t2 = scrape(A)
    ok("result" in r and took < 2 and s2 == 200,
       "clients that send nothing stall neither a JSON-RPC call nor another scrape", f"{took:.2f} s {r} {s2}")
    idle.settimeout(12)
    t0 = time.time()
    raw = b""
    try:
        while True:
            chunk = idle.recv(4096)
            if not chunk:
                break
            raw += chunk
    except OSError as e:
        raw += repr(e).encode()
    waited = time.time() - t0
    idle.close()
    silent.close()
    ok(raw.startswith(b"HTTP/1.1 408 ") and 2 < waited < 9,
       "a head that does not come within 5 s is answered 408 and closed", f"{waited:.1f} s {raw[:200]!r}")
    held_conns = [connect(A) for _ in range(16)]
    time.sleep(0.3)
    s17, _, b17 = exchange(A, b"", shut=False)
    for h in held_conns:
        h.close()
    ok(s17 == 503, "the 17th metrics connection at once is answered 503", (s17, b17[:200]))

    c.close()
    rc = server.term(120)
    server = None
    ok(rc == 0 and not H.qemu_pids(), "SIGTERM: serve exits 0, no QEMU left", f"exit {rc}\n{log_tail()}")

    # --- a unix socket ---
    msock = os.path.join(H.rt, "metrics.sock")
    log_from = os.path.getsize(H.log)
    server = Server(CAPSULE, H, "--metrics", msock, "--test-clock")
    ok(metrics_addr(log_from) == msock and stat.S_ISSOCK(os.stat(msock).st_mode) and
       stat.S_IMODE(os.stat(msock).st_mode) == 0o600, "--metrics PATH: a unix socket, mode 0600, named in the log",
       log_tail())
    c = Connection(H.sock, timeout=60)
    made.clear()
    rpc(c, "status", {"identity": who})
    rpc(c, "list")
    fams, _ = scrape_parsed(msock, "a scrape over the unix socket")
    ok(fams and calls_seen(fams) == {("status", "ok"): 1, ("list", "ok"): 1} and
       value(fams, "capsule_sandboxes", state="stopped") == 1 and value(fams, "capsule_identities") == 1,
       "a new server counts from zero; its recovered sandbox is stopped",
       fams and [fams["capsule_calls_total"], fams["capsule_sandboxes"], fams["capsule_identities"]])
    c.close()
    rc = server.term(60)
    server = None
    ok(rc == 0 and not os.path.exists(msock), "SIGTERM: exit 0 and the metrics socket removed", f"exit {rc}")

    # --- IPv6 loopback, where the host has it ---
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
        v6 = True
    except OSError:
        v6 = False
    if v6:
        log_from = os.path.getsize(H.log)
        server = Server(CAPSULE, H, "--metrics", "[::1]:0", "--test-clock")
        a6 = metrics_addr(log_from)
        s6 = scrape(as_addr(a6))[0] if a6 else None
        rc = server.term(60)
        server = None
        ok(a6 and a6.startswith("[::1]:") and s6 == 200 and rc == 0, "--metrics [::1]:0 serves over IPv6", (a6, s6))
    else:
        print(f"ok {T.n + 1} - --metrics [::1]:0 serves over IPv6 # SKIP no IPv6 loopback on this host", flush=True)
        T.n += 1
    elapsed("done")
except Exception as e:
    import traceback
    ok(False, "the suite ran to its end", f"{traceback.format_exc()}\n{log_tail()}")
finally:
    if server is not None:
        server.term(120)
    if httpd is not None:
        httpd.shutdown()
    for p in H.qemu_pids():
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    subprocess.run(["rm", "-rf", H.rt])
if T.n != PLAN:
    print(f"# ran {T.n} of {PLAN} checks", flush=True)
sys.exit(1 if T.failed or T.n != PLAN else 0)
