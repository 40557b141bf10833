#!/usr/bin/env python3
"""A `docker save` archive of a one-layer image holding a static busybox,
for the Docker-inside suite (tests/integration/test-docker.sh): made here
from the host's busybox-static, so the test pulls nothing.

  docker-archive.py BUSYBOX OUT.tar TAG

The layer has /bin/busybox and /bin/sh and /bin/wget as links to it; the
config runs /bin/sh with PATH=/bin."""
import hashlib
import io
import json
import sys
import tarfile


def tar_bytes(add):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        add(t)
    return buf.getvalue()


def main(argv):
    if len(argv) != 4:
        sys.stderr.write(__doc__)
        return 2
    busybox, out, tag = argv[1:]
    data = open(busybox, "rb").read()

    def layer(t):
        d = tarfile.TarInfo("bin")
        d.type, d.mode = tarfile.DIRTYPE, 0o755
        t.addfile(d)
        f = tarfile.TarInfo("bin/busybox")
        f.size, f.mode = len(data), 0o755
        t.addfile(f, io.BytesIO(data))
        for name in ("sh", "wget", "cat", "echo"):
            ln = tarfile.TarInfo("bin/" + name)
            ln.type, ln.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(ln)

    lay = tar_bytes(layer)
    lay_id = hashlib.sha256(lay).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + lay_id]},
        "history": [{"created_by": "tests/integration/docker-archive.py"}],
    }).encode()
    cfg_id = hashlib.sha256(config).hexdigest()
    manifest = json.dumps([{"Config": cfg_id + ".json", "RepoTags": [tag],
                            "Layers": [lay_id + "/layer.tar"]}]).encode()

    def archive(t):
        for name, content in ((cfg_id + ".json", config), (lay_id + "/layer.tar", lay),
                              ("manifest.json", manifest)):
            i = tarfile.TarInfo(name)
            i.size, i.mode = len(content), 0o644
            t.addfile(i, io.BytesIO(content))

    with open(out, "wb") as f:
        f.write(tar_bytes(archive))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
