#!/usr/bin/env python3
"""Write tests/cri/api.proto: the part of the Kubernetes CRI's
runtime.v1 API (k8s.io/cri-api pkg/apis/runtime/v1/api.proto) that the
CRI suite calls, copied verbatim from the upstream file: the two
services with only the RPCs listed below, and every message and enum
those RPCs reach (with their comments), in upstream order. What is
dropped: the other RPCs and what only they use, and the gogoproto
import and file options (Go code generation only; they change nothing
on the wire) and the line naming upstream's Go generator.

    extract-api.py UPSTREAM_API_PROTO SOURCE_LINE > tests/cri/api.proto

SOURCE_LINE names where UPSTREAM_API_PROTO came from (repository, tag,
commit, path); it goes into the header comment."""
import re
import sys

RPCS = {
    "RuntimeService": ["Version", "RunPodSandbox", "StopPodSandbox", "RemovePodSandbox",
                       "PodSandboxStatus", "ListPodSandbox", "CreateContainer", "StartContainer",
                       "StopContainer", "RemoveContainer", "ListContainers", "ContainerStatus",
                       "UpdateContainerResources", "ExecSync", "Exec", "PortForward",
                       "ContainerStats", "Status"],
    "ImageService": ["ListImages", "ImageStatus", "PullImage", "RemoveImage"],
}


def blocks(lines):
    """(kind, name, text) for each top-level service, message and enum,
    each with the comment lines right above it."""
    out, i, comment = [], 0, []
    while i < len(lines):
        line = lines[i]
        m = re.match(r"(service|message|enum)\s+(\w+)\s*\{", line)
        if not m:
            comment = comment + [line] if line.startswith("//") else []
            i += 1
            continue
        depth, j = 0, i
        while True:
            depth += lines[j].count("{") - lines[j].count("}")
            if depth == 0:
                break
            j += 1
        out.append((m.group(1), m.group(2), comment, lines[i:j + 1]))
        comment, i = [], j + 1
    return out


def service(text, keep):
    """The service's text with only the RPCs in keep (each with its
    comment lines), in upstream order; returns it and the types used."""
    head, body, pending, used = [text[0]], [], [], set()
    for line in text[1:-1]:
        s = line.strip()
        if s.startswith("//"):
            pending.append(line)
            continue
        m = re.match(r"rpc\s+(\w+)\s*\((?:stream\s+)?(\w+)\)\s*returns\s*\((?:stream\s+)?(\w+)\)", s)
        if m and m.group(1) in keep:
            body += pending + [line]
            used |= {m.group(2), m.group(3)}
        elif not m and not s and body and body[-1].strip():
            body.append(line)
        pending = []
    while body and not body[-1].strip():
        body.pop()
    missing = set(keep) - {re.match(r"\s*rpc\s+(\w+)", x).group(1) for x in body if x.strip().startswith("rpc")}
    if missing:
        sys.exit(f"extract-api.py: upstream has no RPC {', '.join(sorted(missing))}")
    return head + body + [text[-1]], used


def main():
    src, origin = sys.argv[1], sys.argv[2]
    lines = open(src).read().split("\n")
    bl = blocks(lines)
    types = {name: text for kind, name, _, text in bl if kind != "service"}
    services, need = {}, set()
    for kind, name, comment, text in bl:
        if kind == "service" and name in RPCS:
            body, used = service(text, RPCS[name])
            services[name] = comment + body
            need |= used
    todo = list(need)
    while todo:
        t = todo.pop()
        for word in re.findall(r"\b[A-Z]\w*\b", "\n".join(x for x in types[t] if not x.strip().startswith("//"))):
            if word in types and word not in need:
                need.add(word)
                todo.append(word)
    out = ["// The part of the Kubernetes Container Runtime Interface (CRI), package",
           "// runtime.v1, that tests/integration/test-cri.sh calls (it plays the",
           "// kubelet against containerd's CRI plugin). Copied verbatim, field",
           "// numbers, names and comments, by tests/cri/extract-api.py from",
           f"// {origin}:",
           "// the services keep only the RPCs the suite makes; the messages and",
           "// enums are those they reach, in upstream order; the gogoproto import",
           "// and file options (Go generation only) are left out. Upstream's",
           "// licence header follows.",
           ""]
    i = 0
    while not lines[i].startswith("syntax"):
        if not lines[i].startswith("// To regenerate"):	# upstream's Go tooling
            out.append(lines[i])
        i += 1
    out += ['syntax = "proto3";', "", "package runtime.v1;", 'option go_package = "k8s.io/cri-api/pkg/apis/runtime/v1";', ""]
    for kind, name, comment, text in bl:
        if kind == "service" and name in services:
            out += services[name] + [""]
        elif kind != "service" and name in need:
            out += comment + text + [""]
    sys.stdout.write("\n".join(out).rstrip("\n") + "\n")


main()
