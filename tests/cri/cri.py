#!/usr/bin/python3
"""A CRI client that plays the kubelet: crictl's verbs over containerd's
CRI plugin (runtime.v1 RuntimeService and ImageService, tests/cri/api.proto),
with the pod and container configurations the kubelet would send, and the
streaming server's WebSocket protocol (v4.channel.k8s.io) for exec and
port-forward. Used by tests/integration/test-cri.sh and bench/bench-cri.py.

    cri.py [-a SOCKET] VERB ARGS...

SOCKET (default $CRI_SOCKET) is containerd's gRPC socket. The Python
modules are generated from api.proto by grpc_tools.protoc into
$CRI_PYDIR (default a temporary directory, removed at exit). A pod's
configuration is kept in $CRI_STATE/pods/ID.json (CreateContainer takes
it again, as the kubelet sends it again). Verbs:

  version                       runtime name, version and API version
  status                        the runtime's conditions (JSON)
  pull REF                      PullImage; prints the image reference
  inspecti REF | rmi REF | images
  runp NAME [--runtime HANDLER] [--cgroup-parent P] [--log-dir D]
                                RunPodSandbox; prints the pod id
  inspectp ID                   PodSandboxStatus, verbose (JSON)
  podip ID                      the pod's IP (PodSandboxStatus.network.ip)
  pods [-q]                     ListPodSandbox
  stopp ID | rmp ID
  create POD NAME IMAGE [--memory BYTES] [--tty] [--stdin] -- ARGS...
                                CreateContainer; prints the container id
  start ID | stop [-t S] ID | rm ID
  inspect ID                    ContainerStatus, verbose (JSON)
  state ID                      CONTAINER_RUNNING, ..._EXITED, ...
  ps [--pod ID] [-q]            ListContainers
  update ID --memory BYTES      UpdateContainerResources (the status
                                resources it had, with memory and
                                memory+swap changed, as the kubelet does)
  stats ID                      ContainerStats (JSON)
  logs ID                       the container's log (the CRI log format,
                                each line checked), its content printed
  exec-sync [--timeout S] ID -- ARGS...
                                ExecSync: stdout, stderr, its exit code
  exec [-i] [-t] [--size ROWSxCOLS] [--resize-when TEXT:ROWSxCOLS] ID -- ARGS...
                                Exec through the streaming server: our
                                stdin to the process (-i), its output to
                                ours, its exit code ours; a terminal (-t)
                                of that size, resized once its output
                                holds TEXT
  port-forward POD PORT         PortForward: one connection to PORT in the
                                pod; our stdin to it, what it sends to ours
"""
import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = float(os.environ.get("CRI_TIMEOUT", "240"))


def load_api():
    """api_pb2 and api_pb2_grpc, generated from api.proto when missing or
    older than it."""
    d = os.environ.get("CRI_PYDIR")
    if not d:
        d = tempfile.mkdtemp(prefix="cri-py.")
        import atexit
        atexit.register(shutil.rmtree, d, True)
    proto = os.path.join(HERE, "api.proto")
    gen = os.path.join(d, "api_pb2_grpc.py")
    if not os.path.exists(gen) or os.path.getmtime(gen) < os.path.getmtime(proto):
        os.makedirs(d, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".gen.", dir=d)
        r = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", HERE,
                            "--python_out=" + tmp, "--grpc_python_out=" + tmp, proto],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"cri.py: grpc_tools.protoc could not compile {proto}: {r.stderr.strip()}"
                     " (python3-grpc-tools installs it)")
        for f in ("api_pb2.py", "api_pb2_grpc.py"):	# the stub last: its presence says done
            os.replace(os.path.join(tmp, f), os.path.join(d, f))
        shutil.rmtree(tmp, True)
    sys.path.insert(0, d)
    import api_pb2
    import api_pb2_grpc
    return api_pb2, api_pb2_grpc


pb, pbg = load_api()
import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402


class Cri:
    """The two CRI services over one channel to containerd's socket."""

    def __init__(self, sock):
        self.channel = grpc.insecure_channel("unix://" + sock)
        self.rt = pbg.RuntimeServiceStub(self.channel)
        self.img = pbg.ImageServiceStub(self.channel)

    def __getattr__(self, name):
        """rt.Name or img.Name, with the suite's deadline."""
        for stub in (self.rt, self.img):
            if hasattr(stub, name):
                method = getattr(stub, name)
                return lambda req, timeout=TIMEOUT: method(req, timeout=timeout)
        raise AttributeError(name)


def state_dir():
    d = os.environ.get("CRI_STATE") or os.path.join(tempfile.gettempdir(), "cri-state")
    os.makedirs(os.path.join(d, "pods"), exist_ok=True)
    return d


def pod_config(name, cgroup_parent, log_dir):
    """A PodSandboxConfig as the kubelet makes it for a pod NAME in the
    namespace "default" (labels and annotations of its own, the pod's
    network, IPC and UTS shared by its containers, PID per container)."""
    uid = hashlib.sha256(f"{name}-{time.time_ns()}".encode()).hexdigest()[:32]
    uid = f"{uid[:8]}-{uid[8:12]}-{uid[12:16]}-{uid[16:20]}-{uid[20:]}"
    log_dir = log_dir or os.path.join(state_dir(), "logs", f"default_{name}_{uid}")
    os.makedirs(log_dir, exist_ok=True)
    c = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="default", attempt=0),
        hostname=name, log_directory=log_dir,
        dns_config=pb.DNSConfig(),
        labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "default",
                "io.kubernetes.pod.uid": uid},
        annotations={"kubernetes.io/config.source": "api"},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=cgroup_parent,
            security_context=pb.LinuxSandboxSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER, ipc=pb.POD))))
    return c


def container_config(name, image, args, memory, tty, stdin):
    """A ContainerConfig as the kubelet makes it: the image's reference,
    ARGS as the command, the log at NAME/0.log under the pod's log
    directory, a CPU share and the memory limit of the pod spec."""
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=name, attempt=0),
        image=pb.ImageSpec(image=image), command=args,
        log_path=f"{name}/0.log", tty=tty, stdin=stdin, stdin_once=False,
        labels={"io.kubernetes.container.name": name},
        annotations={"io.kubernetes.container.restartCount": "0"},
        envs=[pb.KeyValue(key="PATH", value="/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")],
        linux=pb.LinuxContainerConfig(
            resources=pb.LinuxContainerResources(cpu_shares=2, memory_limit_in_bytes=memory, oom_score_adj=1000),
            security_context=pb.LinuxContainerSecurityContext(
                namespace_options=pb.NamespaceOption(network=pb.POD, pid=pb.CONTAINER, ipc=pb.POD))))


def save_pod(pid, config):
    with open(os.path.join(state_dir(), "pods", pid + ".json"), "w") as f:
        f.write(json_format.MessageToJson(config))


def load_pod(pid):
    path = os.path.join(state_dir(), "pods", pid + ".json")
    try:
        with open(path) as f:
            return json_format.Parse(f.read(), pb.PodSandboxConfig())
    except FileNotFoundError:
        sys.exit(f"cri.py: no configuration of pod {pid} in {path} (runp writes it)")


def js(msg):
    return json_format.MessageToJson(msg, preserving_proto_field_name=True)


# --- the streaming server's WebSocket protocol --------------------------------
# RFC 6455 framing (client frames masked), the subprotocol
# v4.channel.k8s.io: each binary message is a channel byte and data
# (exec: 0 stdin, 1 stdout, 2 stderr, 3 error, whose last message is a
# JSON metav1.Status, 4 resize, JSON {"Width","Height"}; port-forward:
# 0 data, 1 error, each starting with the port, 2 bytes little-endian).

class WebSocket:
    def __init__(self, url, protocol="v4.channel.k8s.io", timeout=TIMEOUT):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http":
            raise OSError(f"streaming URL {url}: only http:// is spoken here")
        self.sock = socket.create_connection((u.hostname, u.port or 80), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        path = u.path + ("?" + u.query if u.query else "")
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            d = self.sock.recv(4096)
            if not d:
                raise OSError(f"streaming server {u.netloc} closed the connection during the handshake: {head!r}")
            head += d
        head, self.buf = head.split(b"\r\n\r\n", 1)
        lines = head.decode(errors="replace").split("\r\n")
        if not lines[0].startswith("HTTP/1.1 101"):
            raise OSError(f"streaming server {url} refused the WebSocket upgrade: {lines[0]}")
        hdr = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
        want = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        if hdr.get("sec-websocket-accept") != want:
            raise OSError(f"streaming server {url}: bad Sec-WebSocket-Accept {hdr.get('sec-websocket-accept')!r}")
        self.protocol = hdr.get("sec-websocket-protocol", "")
        self.lock = threading.Lock()

    def _read(self, n):
        while len(self.buf) < n:
            d = self.sock.recv(65536)
            if not d:
                raise EOFError
            self.buf += d
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self):
        """The next data message (bytes), or None once the server closed."""
        msg = b""
        while True:
            try:
                b0, b1 = self._read(2)
                n = b1 & 0x7f
                if n == 126:
                    n = struct.unpack(">H", self._read(2))[0]
                elif n == 127:
                    n = struct.unpack(">Q", self._read(8))[0]
                mask = self._read(4) if b1 & 0x80 else None
                data = self._read(n)
            except (EOFError, ConnectionError):
                return None
            if mask:
                data = bytes(c ^ mask[i % 4] for i, c in enumerate(data))
            op = b0 & 0x0f
            if op == 8:	# close
                try:
                    self._send(8, data[:2])
                except OSError:
                    pass
                return None
            if op == 9:	# ping
                self._send(10, data)
                continue
            if op == 10:
                continue
            msg += data
            if b0 & 0x80:
                return msg

    def _send(self, op, data):
        mask = os.urandom(4)
        n = len(data)
        if n < 126:
            h = struct.pack(">BB", 0x80 | op, 0x80 | n)
        elif n < 1 << 16:
            h = struct.pack(">BBH", 0x80 | op, 0x80 | 126, n)
        else:
            h = struct.pack(">BBQ", 0x80 | op, 0x80 | 127, n)
        masked = bytes(c ^ mask[i % 4] for i, c in enumerate(data))
        with self.lock:
            self.sock.sendall(h + mask + masked)

    def send(self, channel, data):
        self._send(2, bytes([channel]) + data)

    def close(self):
        try:
            self._send(8, struct.pack(">H", 1000))
        except OSError:
            pass
        self.sock.close()


def pump_stdin(ws, channel):
    """Our stdin to CHANNEL until its end (the v4 protocol has no
    half-close: the process sees no EOF)."""
    def run():
        fd = sys.stdin.fileno()
        while True:
            try:
                d = os.read(fd, 65536)
            except OSError:
                return
            if not d:
                return
            try:
                ws.send(channel, d)
            except OSError:
                return
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def exit_code_of(status):
    """The exit code a v4 error-channel metav1.Status says."""
    if not status:
        return None
    try:
        s = json.loads(status)
    except ValueError:
        sys.stderr.write(f"cri.py: exec: the streaming server said {status!r}\n")
        return 1
    if s.get("status") == "Success":
        return 0
    for c in (s.get("details") or {}).get("causes") or []:
        if c.get("reason") == "ExitCode":
            return int(c.get("message", "1"))
    sys.stderr.write(f"cri.py: exec failed: {s.get('message', status)}\n")
    return 1


def channel_frames(ws):
    """The (channel, data) of each message until the server closes."""
    while True:
        m = ws.recv()
        if m is None:
            return
        if m:
            yield m[0], m[1:]


def do_exec(c, a):
    r = c.Exec(pb.ExecRequest(container_id=a.id, cmd=a.args, tty=a.tty, stdin=a.stdin,
                              stdout=True, stderr=not a.tty))
    ws = WebSocket(r.url)
    if a.size:
        rows, cols = (int(x) for x in a.size.split("x"))
        ws.send(4, json.dumps({"Width": cols, "Height": rows}).encode())
    if a.stdin:
        pump_stdin(ws, 0)
    later = a.resize_when.rsplit(":", 1) if a.resize_when else None
    seen, status = b"", b""
    out = sys.stdout.buffer
    for ch, data in channel_frames(ws):
        if ch == 1:
            out.write(data)
            out.flush()
            seen += data
            if later and later[0].encode() in seen:
                rows, cols = (int(x) for x in later[1].split("x"))
                ws.send(4, json.dumps({"Width": cols, "Height": rows}).encode())
                later = None
        elif ch == 2:
            sys.stderr.buffer.write(data)
            sys.stderr.buffer.flush()
        elif ch == 3:
            status += data
    ws.close()
    code = exit_code_of(status.decode(errors="replace"))
    if code is None:
        sys.exit("cri.py: exec: the streaming server closed without an exit status")
    return code


def do_port_forward(c, a):
    r = c.PortForward(pb.PortForwardRequest(pod_sandbox_id=a.pod, port=[a.port]))
    sep = "&" if "?" in r.url else "?"
    ws = WebSocket(f"{r.url}{sep}port={a.port}")
    first = {0: True, 1: True}
    err = b""
    pump_stdin(ws, 0)
    out = sys.stdout.buffer
    for ch, data in channel_frames(ws):
        if ch in first and first[ch]:	# each channel opens with the port
            first[ch] = False
            if len(data) < 2 or struct.unpack("<H", data[:2])[0] != a.port:
                sys.exit(f"cri.py: port-forward: channel {ch} did not open with port {a.port}: {data[:2]!r}")
            data = data[2:]
        if ch == 0:
            out.write(data)
            out.flush()
        elif ch == 1:
            err += data
    ws.close()
    if err:
        sys.stderr.write(f"cri.py: port-forward: {err.decode(errors='replace')}\n")
        return 1
    return 0


# --- the CRI log format ---------------------------------------------------------
LOG_LINE = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) (stdout|stderr) ([PF]) (.*)$")


def read_log(path):
    """(stream, content) pieces of a CRI log file, partial lines (P)
    joined to the full one that ends them; raises ValueError naming a
    line not in the format."""
    out, part = [], {}
    with open(path, "rb") as f:
        for i, line in enumerate(f.read().split(b"\n")[:-1], 1):
            m = LOG_LINE.match(line)
            if not m:
                raise ValueError(f"{path}:{i}: not a CRI log line (TIMESTAMP STREAM P|F CONTENT): {line[:80]!r}")
            stream, tag, text = m.group(2).decode(), m.group(3), m.group(4)
            part[stream] = part.get(stream, b"") + text
            if tag == b"F":
                out.append((stream, part.pop(stream)))
    return out


def main():
    ap = argparse.ArgumentParser(prog="cri.py", description="a CRI client that plays the kubelet")
    ap.add_argument("-a", "--address", default=os.environ.get("CRI_SOCKET", "/run/containerd/containerd.sock"))
    sub = ap.add_subparsers(dest="verb", required=True)
    sub.add_parser("version")
    sub.add_parser("status")
    for v in ("pull", "inspecti", "rmi"):
        sub.add_parser(v).add_argument("ref")
    sub.add_parser("images")
    p = sub.add_parser("runp")
    p.add_argument("name")
    p.add_argument("--runtime", default=os.environ.get("CRI_RUNTIME_HANDLER", ""))
    p.add_argument("--cgroup-parent", default="")
    p.add_argument("--log-dir", default="")
    for v in ("inspectp", "podip", "stopp", "rmp", "start", "rm", "inspect", "state", "stats", "logs"):
        sub.add_parser(v).add_argument("id")
    sub.add_parser("pods").add_argument("-q", action="store_true")
    p = sub.add_parser("create")
    p.add_argument("pod")
    p.add_argument("name")
    p.add_argument("image")
    p.add_argument("--memory", type=int, default=0)
    p.add_argument("--tty", action="store_true")
    p.add_argument("--stdin", action="store_true")
    p.add_argument("args", nargs="+")
    p = sub.add_parser("stop")
    p.add_argument("-t", type=int, default=10)
    p.add_argument("id")
    p = sub.add_parser("ps")
    p.add_argument("--pod", default="")
    p.add_argument("-q", action="store_true")
    p = sub.add_parser("update")
    p.add_argument("id")
    p.add_argument("--memory", type=int, required=True)
    p = sub.add_parser("exec-sync")
    p.add_argument("--timeout", type=int, default=60)
    p.add_argument("id")
    p.add_argument("args", nargs="+")
    p = sub.add_parser("exec")
    p.add_argument("-i", dest="stdin", action="store_true")
    p.add_argument("-t", dest="tty", action="store_true")
    p.add_argument("--size", default="")
    p.add_argument("--resize-when", default="")
    p.add_argument("id")
    p.add_argument("args", nargs="+")
    p = sub.add_parser("port-forward")
    p.add_argument("pod")
    p.add_argument("port", type=int)
    a = ap.parse_args()
    c = Cri(a.address)
    try:
        return run(c, a)
    except grpc.RpcError as e:
        sys.stderr.write(f"cri.py {a.verb}: {e.code().name}: {e.details()}\n")
        return 1
    except OSError as e:
        sys.stderr.write(f"cri.py {a.verb}: {e}\n")
        return 1


def run(c, a):
    v = a.verb
    if v == "version":
        r = c.Version(pb.VersionRequest(version="v1"))
        print(r.runtime_name, r.runtime_version, r.runtime_api_version)
    elif v == "status":
        print(js(c.Status(pb.StatusRequest(verbose=False))))
    elif v == "pull":
        print(c.PullImage(pb.PullImageRequest(image=pb.ImageSpec(image=a.ref))).image_ref)
    elif v == "inspecti":
        r = c.ImageStatus(pb.ImageStatusRequest(image=pb.ImageSpec(image=a.ref)))
        if not r.HasField("image"):
            sys.stderr.write(f"cri.py: no image {a.ref}\n")
            return 1
        print(js(r.image))
    elif v == "rmi":
        c.RemoveImage(pb.RemoveImageRequest(image=pb.ImageSpec(image=a.ref)))
    elif v == "images":
        for i in c.ListImages(pb.ListImagesRequest()).images:
            print(i.id, " ".join(i.repo_tags))
    elif v == "runp":
        conf = pod_config(a.name, a.cgroup_parent, a.log_dir)
        r = c.RunPodSandbox(pb.RunPodSandboxRequest(config=conf, runtime_handler=a.runtime))
        save_pod(r.pod_sandbox_id, conf)
        print(r.pod_sandbox_id)
    elif v == "inspectp":
        r = c.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=a.id, verbose=True))
        out = json.loads(js(r.status))
        out["info"] = {k: json.loads(x) if x[:1] in "{[" else x for k, x in r.info.items()}
        print(json.dumps(out, indent=1))
    elif v == "podip":
        r = c.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=a.id))
        if not r.status.network.ip:
            sys.stderr.write(f"cri.py: pod {a.id} has no IP\n")
            return 1
        print(r.status.network.ip)
    elif v == "pods":
        for p in c.ListPodSandbox(pb.ListPodSandboxRequest()).items:
            print(p.id if a.q else f"{p.id} {p.metadata.name} {pb.PodSandboxState.Name(p.state)} {p.runtime_handler}")
    elif v == "stopp":
        c.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=a.id))
    elif v == "rmp":
        c.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=a.id))
        try:
            os.unlink(os.path.join(state_dir(), "pods", a.id + ".json"))
        except FileNotFoundError:
            pass
    elif v == "create":
        conf = container_config(a.name, a.image, a.args, a.memory, a.tty, a.stdin)
        r = c.CreateContainer(pb.CreateContainerRequest(pod_sandbox_id=a.pod, config=conf,
                                                        sandbox_config=load_pod(a.pod)))
        print(r.container_id)
    elif v == "start":
        c.StartContainer(pb.StartContainerRequest(container_id=a.id))
    elif v == "stop":
        c.StopContainer(pb.StopContainerRequest(container_id=a.id, timeout=a.t), timeout=TIMEOUT + a.t)
    elif v == "rm":
        c.RemoveContainer(pb.RemoveContainerRequest(container_id=a.id))
    elif v == "inspect":
        r = c.ContainerStatus(pb.ContainerStatusRequest(container_id=a.id, verbose=True))
        out = json.loads(js(r.status))
        out["info"] = {k: json.loads(x) if x[:1] in "{[" else x for k, x in r.info.items()}
        print(json.dumps(out, indent=1))
    elif v == "state":
        r = c.ContainerStatus(pb.ContainerStatusRequest(container_id=a.id))
        print(pb.ContainerState.Name(r.status.state))
    elif v == "ps":
        f = pb.ContainerFilter(pod_sandbox_id=a.pod)
        for x in c.ListContainers(pb.ListContainersRequest(filter=f)).containers:
            print(x.id if a.q else f"{x.id} {x.metadata.name} {pb.ContainerState.Name(x.state)} {x.pod_sandbox_id}")
    elif v == "update":
        # The kubelet sends the whole LinuxContainerResources: those of
        # the container's status when the runtime reports them, else the
        # ones it was created with (the verbose info's runtime spec).
        r = c.ContainerStatus(pb.ContainerStatusRequest(container_id=a.id, verbose=True))
        res = pb.LinuxContainerResources()
        if r.status.HasField("resources") and r.status.resources.HasField("linux"):
            res.CopyFrom(r.status.resources.linux)
        else:
            spec = json.loads(r.info.get("info", "{}")).get("runtimeSpec", {})
            cpu = spec.get("linux", {}).get("resources", {}).get("cpu", {})
            res.cpu_shares = cpu.get("shares", 0)
            res.cpu_quota = cpu.get("quota", 0)
            res.cpu_period = cpu.get("period", 0)
        res.memory_limit_in_bytes = a.memory
        res.memory_swap_limit_in_bytes = a.memory	# no swap: the kubelet's default
        c.UpdateContainerResources(pb.UpdateContainerResourcesRequest(container_id=a.id, linux=res))
    elif v == "stats":
        print(js(c.ContainerStats(pb.ContainerStatsRequest(container_id=a.id)).stats))
    elif v == "logs":
        r = c.ContainerStatus(pb.ContainerStatusRequest(container_id=a.id))
        try:
            for stream, text in read_log(r.status.log_path):
                (sys.stdout if stream == "stdout" else sys.stderr).buffer.write(text + b"\n")
        except (OSError, ValueError) as e:
            sys.stderr.write(f"cri.py: logs: {e}\n")
            return 1
    elif v == "exec-sync":
        r = c.ExecSync(pb.ExecSyncRequest(container_id=a.id, cmd=a.args, timeout=a.timeout),
                       timeout=TIMEOUT + a.timeout)
        sys.stdout.buffer.write(r.stdout)
        sys.stderr.buffer.write(r.stderr)
        return r.exit_code
    elif v == "exec":
        return do_exec(c, a)
    elif v == "port-forward":
        return do_port_forward(c, a)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    sys.exit(main())
