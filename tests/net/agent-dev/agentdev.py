#!/usr/bin/env python3
"""Developer harness for the guest side of a NIC (guest/agent/agent-net.c,
agent-publish.c), without the engine: boot the agent in a microVM whose NIC
is a plain `-netdev user` in a fresh network namespace (no uplink: the only
link is lo), speak the agent protocol to it, and check what SETUP's network
fields do.

    python3 tests/net/agent-dev/agentdev.py [AGENT]

AGENT defaults to build/capsule-agent. Needs root (unshare -n), QEMU,
busybox-static and the cached guest kernel (~/.cache/capsule/kernel). It
prints "N passed, M failed" and exits non-zero on a failure. Nothing leaves
the namespace: the guest's gateway is QEMU's slirp, which has nowhere to go.
"""
import glob
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

HDR = struct.Struct("<IHHI")
HELLO, EXEC, STDIN, STDOUT, STDERR, EXIT, SIGNAL, SHUTDOWN, ERROR, SETUP = range(1, 11)
LISTENERS = 15
ADDR, GW, DNS = 0x0A00020F, 0x0A000202, 0x0A000203
HOSTFWD = 19090  # in QEMU's namespace, to the guest's 9090 and 7070
HOSTFWD_ECHO = 17070


def cpio_entry(name, mode, data=b"", rdev=(0, 0), ino=[0]):
    ino[0] += 1
    name_b = name.encode() + b"\0"
    hdr = "070701" + "".join("%08X" % v for v in (
        ino[0], mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name_b), 0))
    out = hdr.encode() + name_b
    out += b"\0" * ((4 - len(out) % 4) % 4)
    out += data
    out += b"\0" * ((4 - len(out) % 4) % 4)
    return out


def make_initramfs(agent, path):
    busybox = "/bin/busybox"
    applets = subprocess.run([busybox, "--list-full"], capture_output=True, text=True,
                             check=True).stdout.split()
    out = b""
    for d in ["bin", "dev", "dev/pts", "etc", "proc", "root", "run", "sbin", "sys", "tmp",
              "usr", "usr/bin", "usr/sbin", "work"]:
        out += cpio_entry(d, 0o040000 | (0o1777 if d == "tmp" else 0o700 if d == "root" else 0o755))
    out += cpio_entry("dev/console", 0o020600, rdev=(5, 1))
    out += cpio_entry("dev/null", 0o020666, rdev=(1, 3))
    out += cpio_entry("etc/passwd", 0o100644,
                      b"root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/work:/bin/sh\n")
    out += cpio_entry("etc/group", 0o100644, b"root:x:0:\nuser:x:1000:\n")
    # A symbolic link where resolv.conf goes, as distributions ship it:
    # the agent must replace it, not write through it.
    out += cpio_entry("etc/resolv.conf", 0o120777, b"/tmp/resolv-target")
    out += cpio_entry("init", 0o100755, open(agent, "rb").read())
    out += cpio_entry("bin/busybox", 0o100755, open(busybox, "rb").read())
    for a in sorted(set(applets)):
        a = a.lstrip("/")
        if a and a != "bin/busybox":
            out += cpio_entry(a, 0o120777, b"/bin/busybox")
    out += cpio_entry("TRAILER!!!", 0)
    with open(path, "wb") as f:
        f.write(out)


def s(x):
    b = x.encode()
    return struct.pack("<I", len(b)) + b


class Agent:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        for _ in range(200):
            try:
                self.sock.connect(path)
                break
            except OSError:
                time.sleep(0.05)
        self.buf = b""
        self.listeners = []  # every LISTENERS set received, in order
        self.streams = {}
        self.next_id = 1

    def send(self, typ, stream, payload=b""):
        self.sock.sendall(HDR.pack(len(payload), typ, 0, stream) + payload)

    def frame(self, timeout):
        self.sock.settimeout(timeout)
        while len(self.buf) < 12 or len(self.buf) < 12 + HDR.unpack_from(self.buf)[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("agent closed the connection")
            self.buf += chunk
        n, typ, _, stream = HDR.unpack_from(self.buf)
        payload, self.buf = self.buf[12:12 + n], self.buf[12 + n:]
        if typ == LISTENERS:
            k = struct.unpack_from("<I", payload)[0]
            assert len(payload) == 4 + 2 * k, "LISTENERS length"
            self.listeners.append(list(struct.unpack_from("<%dH" % k, payload, 4)))
        elif stream in self.streams:
            st = self.streams[stream]
            if typ in (STDOUT, STDERR):
                st[typ] += payload
            elif typ == EXIT:
                st["exit"] = struct.unpack("<BBHiI", payload)
            elif typ == ERROR:
                st["exit"] = ("error", payload)
        return typ, stream, payload

    def wait(self, pred, timeout):
        end = time.time() + timeout
        while not pred():
            left = end - time.time()
            if left <= 0:
                return False
            try:
                self.frame(left)
            except socket.timeout:
                return False
        return True

    def hello(self):
        self.send(HELLO, 0, struct.pack("<II", 1, 0) + b"agentdev")
        typ, _, _ = self.frame(60)
        assert typ == HELLO

    def setup(self, hostname="devbox", addr=ADDR, gw=GW, dns=DNS, prefix=24, proxy=3128, auto=1,
              disks=("", "")):
        ns = time.time_ns()
        p = s(disks[0]) + s(disks[1]) + s("") + s("") + s(hostname)
        p += struct.pack("<II", ns & 0xFFFFFFFF, ns >> 32) + os.urandom(32)
        p += struct.pack("<IIIBHB", addr, gw, dns, prefix, proxy, auto)
        self.send(SETUP, 0, p)
        while True:
            typ, _, payload = self.frame(60)
            if typ == SETUP:
                return struct.unpack_from("<i", payload)[0], payload[4:].decode()

    def start(self, argv, env=(), timeout_ms=60000):
        sid = self.next_id
        self.next_id += 1
        p = struct.pack("<IIIHH", timeout_ms, 0, 0, 0, 0)
        p += struct.pack("<I", len(argv)) + b"".join(s(a) for a in argv)
        p += struct.pack("<I", len(env)) + b"".join(s(e) for e in env) + s("")
        self.streams[sid] = {STDOUT: b"", STDERR: b"", "exit": None}
        self.send(EXEC, sid, p)
        return sid

    def run(self, argv, env=(), timeout=60):
        sid = self.start(argv, env)
        st = self.streams[sid]
        assert self.wait(lambda: st["exit"] is not None, timeout), "no EXIT for %r" % argv
        return st

    def sh(self, script, env=()):
        st = self.run(["/bin/sh", "-c", script], env)
        code = st["exit"][3] if st["exit"][0] == 0 else -1
        return code, st[STDOUT].decode(errors="replace") + st[STDERR].decode(errors="replace")


RESULTS = [0, 0]


def check(name, ok, detail=""):
    RESULTS[0 if ok else 1] += 1
    print("%s - %s%s" % ("ok" if ok else "not ok", name, "" if ok else ": " + detail.strip()[:2000]))


def make_image(tmp):
    """An erofs root like an image's (busybox, a user, /etc left writable by
    its builder, resolv.conf a link into /run) and an empty ext4 upper."""
    tree = os.path.join(tmp, "tree")
    for d in ["bin", "dev", "etc", "proc", "run", "sys", "tmp", "work", "source"]:
        os.makedirs(os.path.join(tree, d), exist_ok=True)
    os.chmod(os.path.join(tree, "etc"), 0o777)
    os.chmod(os.path.join(tree, "tmp"), 0o1777)
    with open(os.path.join(tree, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/work:/bin/sh\n")
    with open(os.path.join(tree, "etc/group"), "w") as f:
        f.write("root:x:0:\nuser:x:1000:\n")
    os.symlink("../run/systemd/resolve/stub-resolv.conf", os.path.join(tree, "etc/resolv.conf"))
    subprocess.run(["cp", "/bin/busybox", os.path.join(tree, "bin/busybox")], check=True)
    for a in ["sh", "ls", "cat", "stat", "echo", "env", "grep", "sort", "rm", "touch", "mv", "wc",
              "ip", "wget", "netstat", "ps", "head", "md5sum", "cut", "mkdir", "httpd", "ln"]:
        os.symlink("busybox", os.path.join(tree, "bin", a))
    img = os.path.join(tmp, "root.erofs")
    upper = os.path.join(tmp, "upper.ext4")
    subprocess.run(["mkfs.erofs", "--quiet", img, tree], check=True, capture_output=True)
    with open(upper, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", upper], check=True, capture_output=True)
    return ["-drive", "id=d0,file=%s,format=raw,if=none,readonly=on" % img,
            "-device", "virtio-blk-device,drive=d0,serial=img",
            "-drive", "id=d1,file=%s,format=raw,if=none" % upper,
            "-device", "virtio-blk-device,drive=d1,serial=upper"]


def boot(agent, kernel, mode):
    """Boot one VM (the initramfs as its root, or an image's overlay) and run
    the checks against it."""
    tmp = tempfile.mkdtemp(prefix="agentdev-")
    initrd = os.path.join(tmp, "initrd")
    make_initramfs(agent, initrd)
    disks = make_image(tmp) if mode == "image" else []
    sock = os.path.join(tmp, "agent.sock")
    accel = os.environ.get("AGENTDEV_ACCEL", "tcg")
    qemu = ["qemu-system-x86_64", "-M", "microvm,acpi=off", "-accel", accel, "-cpu",
            "host" if accel == "kvm" else "max", "-m", "256M", "-nodefaults", "-no-user-config",
            "-display", "none", "-no-reboot", "-kernel", kernel, "-initrd", initrd,
            "-append", "console=ttyS0 panic=-1 reboot=t quiet",
            "-serial", "file:" + os.path.join(tmp, "console.log"),
            "-chardev", "socket,id=agent,path=%s,server=on,wait=off" % sock,
            "-device", "virtio-serial-device",
            "-device", "virtserialport,chardev=agent,name=capsule.agent"] + disks + [
            "-netdev", "user,id=net0,ipv6=off,hostfwd=tcp:127.0.0.1:%d-:9090,"
                       "hostfwd=tcp:127.0.0.1:%d-:7070" % (HOSTFWD, HOSTFWD_ECHO),
            "-device", "virtio-net-device,netdev=net0"]
    # A fresh network namespace with lo only: slirp's sockets go nowhere.
    vm = subprocess.Popen(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "qemu"]
                          + qemu, start_new_session=True)
    failed = RESULTS[1]
    try:
        if mode == "plain":
            plain_checks(Agent(sock))
        else:
            run_checks(Agent(sock), vm, mode == "image")
    finally:
        os.killpg(vm.pid, signal.SIGKILL)
        vm.wait()
        if RESULTS[1] > failed:
            print("# console log kept in", tmp)
        else:
            subprocess.run(["rm", "-rf", tmp])


def main():
    root = os.path.dirname(os.path.abspath(__file__))
    agent = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "../../../build/capsule-agent")
    kernels = sorted(glob.glob(os.path.expanduser("~/.cache/capsule/kernel/[0-9]*/vmlinux")))
    if not kernels:
        print("no cached guest kernel; build one with `make`")
        return 2
    for mode in ("initramfs", "image", "plain"):
        print("# root:", {"initramfs": "the initramfs", "image": "an image's overlay",
                          "plain": "the initramfs, without proxy or auto-publish"}[mode])
        boot(agent, kernels[-1], mode)
    print("%d passed, %d failed" % tuple(RESULTS))
    return 1 if RESULTS[1] else 0


def in_vm_netns(vm, code):
    """Run Python code in QEMU's network namespace (to reach its hostfwd)."""
    qpid = subprocess.run(["pgrep", "-P", str(vm.pid)], capture_output=True, text=True).stdout.split()
    pid = qpid[0] if qpid else str(vm.pid)
    return subprocess.run(["nsenter", "--net=/proc/%s/ns/net" % pid, sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)


def plain_checks(a):
    a.hello()
    err, msg = a.setup(proxy=0, auto=0)
    check("SETUP with a network, no proxy, no auto-publish", err == 0, msg)
    code, out = a.sh("env; ip -4 addr show eth0")
    check("no proxy variables without a proxy port", "proxy" not in out.lower(), out)
    check("the address is set all the same", "inet 10.0.2.15/24" in out, out)
    a.wait(lambda: False, 2.5)
    check("no LISTENERS without auto-publish", a.listeners == [], repr(a.listeners))


def run_checks(a, vm, image):
    a.hello()
    disks = ("img", "upper") if image else ("", "")
    if not image:
        # A failed SETUP may be sent again; with an image its overlay is
        # mounted by then, so these run on the initramfs only.
        err, msg = a.setup(gw=0x0A090909)
        check("a gateway off the link fails SETUP naming the step",
              err == 101 and msg.startswith("cannot add the default route via 10.9.9.9 on eth0"), msg)
        err, msg = a.setup(gw=0)
        check("an address without a gateway is refused", err == 22 and "no gateway" in msg, msg)
    err, msg = a.setup(disks=disks)
    check("SETUP with a network succeeds (and again after a failed one)", err == 0, msg)
    if err:
        return 1
    check("the first LISTENERS set follows SETUP, empty", a.wait(lambda: a.listeners, 5)
          and a.listeners[0] == [], repr(a.listeners))

    code, out = a.sh("ip -4 addr show; ip route; ip link show lo")
    check("eth0 has 10.0.2.15/24", "inet 10.0.2.15/24" in out and "eth0" in out, out)
    check("default route via 10.0.2.2", "default via 10.0.2.2 dev eth0" in out, out)
    check("lo is up", "127.0.0.1/8" in out and "LOOPBACK,UP" in out, out)

    code, out = a.sh("cat /etc/resolv.conf; echo --; cat /etc/hosts; echo --; "
                     "stat -c '%U %a %F' /etc /etc/resolv.conf /etc/hosts; "
                     "ls /tmp/resolv-target 2>&1")
    check("resolv.conf names the DNS server", "nameserver 10.0.2.3\n" in out, out)
    check("hosts maps host.capsule.internal and the hostname",
          "10.0.2.2\thost.capsule.internal" in out and "10.0.2.15\tdevbox" in out
          and "127.0.0.1\tlocalhost" in out, out)
    check("/etc and its files are root's, 0755/0644, regular files",
          "root 755 directory\nroot 644 regular file\nroot 644 regular file" in out, out)
    check("the symbolic link at resolv.conf was replaced, not followed",
          "No such file" in out, out)
    code, out = a.sh("echo x >> /etc/hosts; echo x > /etc/resolv.conf; rm -f /etc/hosts; "
                     "touch /etc/new; mv /etc/hosts /etc/h; echo; "
                     "wc -l < /etc/hosts; stat -c '%U %a' /etc/resolv.conf; ls /etc")
    check("the tool user cannot change /etc/hosts or /etc/resolv.conf",
          out.count("Permission denied") == 5 and
          "\n3\nroot 644\ngroup\nhosts\npasswd\nresolv.conf\n/bin/sh" in out, repr(out))
    code, out = a.sh("env | grep -i proxy | sort")
    want = ["HTTPS_PROXY=http://10.0.2.2:3128", "HTTP_PROXY=http://10.0.2.2:3128",
            "NO_PROXY=localhost,127.0.0.1,::1", "http_proxy=http://10.0.2.2:3128",
            "https_proxy=http://10.0.2.2:3128", "no_proxy=localhost,127.0.0.1,::1"]
    check("commands get the proxy variables", out.split() == want, out)
    code, out = a.sh("env | grep -i proxy | sort", env=["https_proxy=http://mine:1", "NO_PROXY=x"])
    check("the request's own variables win", "https_proxy=http://mine:1" in out
          and "NO_PROXY=x" in out and out.count("https_proxy=") == 1
          and out.count("NO_PROXY=") == 1 and "HTTP_PROXY=http://10.0.2.2:3128" in out, out)

    # A server on 127.0.0.1 only: reported, and relayed from 10.0.2.15.
    a.sh("mkdir -p /tmp/www && echo hello-from-loopback > /tmp/www/index.html")
    n0 = len(a.listeners)
    httpd = a.start(["httpd", "-f", "-p", "127.0.0.1:9090", "-h", "/tmp/www"], timeout_ms=600000)
    t0 = time.time()
    got = a.wait(lambda: len(a.listeners) > n0 and 9090 in a.listeners[-1], 10)
    check("a loopback listener is reported (%.1f s)" % (time.time() - t0), got, repr(a.listeners))
    time.sleep(0.5)
    code, out = a.sh("wget -Y off -qO- http://10.0.2.15:9090/index.html; netstat -ltn 2>/dev/null")
    check("the relay reaches it from the guest's address", "hello-from-loopback" in out, out)
    check("the relay listens on 10.0.2.15:9090 only", "10.0.2.15:9090" in out, out)
    check("the relay's socket is not reported", a.listeners[-1] == [9090], repr(a.listeners))
    r = in_vm_netns(vm, "import socket;c=socket.create_connection(('127.0.0.1',%d),5);"
                        "c.sendall(b'GET /index.html HTTP/1.0\\r\\n\\r\\n');"
                        "print(c.makefile('rb').read().decode())" % HOSTFWD)
    check("QEMU's forward reaches it through the relay", "hello-from-loopback" in r.stdout,
          r.stdout + r.stderr)
    code, out = a.sh("ps -o user,args")
    check("the relay runs as 65534", any(l.split()[:2] == ["65534", "/init"] for l in out.splitlines()), out)
    a.send(SIGNAL, httpd, struct.pack("<I", 9))
    got = a.wait(lambda: a.listeners[-1] == [], 10)
    check("a listener that goes away is reported gone", got, repr(a.listeners))
    time.sleep(1.5)
    code, out = a.sh("netstat -ltn 2>/dev/null")
    check("its relay is stopped", ":9090" not in out, out)

    # Half-close through the relay: the client sends its request and shuts
    # its side; 2 MB still come back whole.
    a.sh("head -c 2000000 /dev/urandom > /tmp/www/big && md5sum /tmp/www/big > /tmp/www/big.md5")
    code, md5 = a.sh("cut -d' ' -f1 /tmp/www/big.md5")
    big = a.start(["httpd", "-f", "-p", "127.0.0.1:7070", "-h", "/tmp/www"], timeout_ms=600000)
    a.wait(lambda: 7070 in a.listeners[-1], 10)
    time.sleep(1.5)
    r = in_vm_netns(vm, "import socket,hashlib;c=socket.create_connection(('127.0.0.1',%d),5);"
                        "c.sendall(b'GET /big HTTP/1.0\\r\\n\\r\\n');c.shutdown(socket.SHUT_WR);"
                        "c.settimeout(30);d=c.makefile('rb').read();b=d.split(b'\\r\\n\\r\\n',1)[1];"
                        "print(len(b),hashlib.md5(b).hexdigest())" % HOSTFWD_ECHO)
    check("after the client's half-close, 2 MB come back whole through the relay",
          r.stdout.split() == ["2000000", md5.strip()], r.stdout + r.stderr + md5)
    a.send(SIGNAL, big, struct.pack("<I", 9))
    a.wait(lambda: a.listeners[-1] == [], 10)

    # A server on 0.0.0.0: reported once, not relayed.
    srv = a.start(["httpd", "-f", "-p", "8080", "-h", "/tmp/www"], timeout_ms=600000)
    got = a.wait(lambda: a.listeners[-1] == [8080], 10)
    check("a 0.0.0.0 listener is reported", got, repr(a.listeners))
    code, out = a.sh("netstat -ltn 2>/dev/null")
    check("a 0.0.0.0 listener is not relayed", "10.0.2.15:8080" not in out, out)
    a.send(SIGNAL, srv, struct.pack("<I", 9))
    a.wait(lambda: a.listeners[-1] == [], 10)

    # The same set is not sent again; a new host session gets it again.
    n = len(a.listeners)
    a.wait(lambda: False, 2.5)
    check("an unchanged set is not sent again", len(a.listeners) == n, repr(a.listeners))
    a.hello()
    check("a new HELLO gets the current set", a.wait(lambda: len(a.listeners) > n, 5), repr(a.listeners))

    code, out = a.sh("ls /proc/1/fd 2>&1 | head -1; for p in /proc/[0-9]*; do "
                     "[ -r $p/fd ] && ls -l $p/fd; done 2>/dev/null | grep -c 'capsule\\|vport' ")
    check("commands hold none of the agent's descriptors", out.split()[-1] == "0", out)


if __name__ == "__main__":
    sys.exit(main())
