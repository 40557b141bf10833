#!/usr/bin/env python3
"""Files in and out of a sandbox: inline bytes (up to 16 MiB), and a tree
through a transfer directory (`capsule serve --transfer-dir DIR`).

    python3 examples/transfer.py SOCKET [TRANSFER_DIR]"""
import os
import sys
import tempfile

from capsule_client import Client, Identity

sock = sys.argv[1]
xfer = sys.argv[2] if len(sys.argv) > 2 else None
who = Identity("example", "alice")

with Client(sock) as c:
    script = b"#!/bin/sh\necho generated > /work/out/report.txt\n"
    c.exec(who, ["mkdir", "-p", "/work/out"])
    c.upload(who, "make-report.sh", script, mode=0o755)
    c.exec(who, ["/work/make-report.sh"])
    got = c.download(who, "out/report.txt")
    print(f"downloaded {got.bytes} bytes: {got.content!r}")

    if xfer:
        # A directory both ways: from_path and to must be inside a --transfer-dir.
        src = tempfile.mkdtemp(dir=xfer)
        with open(os.path.join(src, "data.csv"), "w") as f:
            f.write("a,b\n1,2\n")
        up = c.upload(who, "dataset", from_path=src)
        print(f"uploaded {up.files} files, {up.bytes} bytes")
        out = os.path.join(xfer, "results-" + os.path.basename(src))
        down = c.download(who, "out", to=out)
        print(f"downloaded {down.files} files into {down.to}")
