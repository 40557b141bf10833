#!/usr/bin/env python3
"""The header fence (issue 32): front ends compile against the library's
public headers only. TAP, one test per front-end file, one per public
header, and two that plant a bad include to show the check fails.

The rule. A front end is src/cli, src/mcp, src/serve or src/oci. Every
#include of a front-end file (.c or .h) names one of:
  - a header of its own folder (oci-int.h in src/oci is its own);
  - a header of src/common or src/proto;
  - a public header of the library, listed in PUBLIC below (controller.h,
    sandbox.h and engine-types.h, the named-sandbox, transfer and
    workspace APIs, the store's and the tree's APIs, the network policy's
    parser) -- nothing else of src/controller, src/engine, src/store,
    src/net, src/sandbox or src/tree: never engine.h, jail.h, a
    store-internal.h or any other folder's *-internal.h / *-int.h;
  - the entry point of another front end, only where ENTRY says so (the
    CLI starts the others; capsule mcp's remote mode uses serve's client).
And the public headers keep the fence too: what each of them includes,
followed through every header it reaches, is src/common, src/proto or
another public header -- so controller.h or sandbox.h cannot hand a front
end engine.h or jail.h by the back door. A failure names file:line, what
it includes and the rule; through a public header, the chain of includes.

Headers are found as the compiler finds them: a quoted name in the
including file's folder first, then in meson.build's inc_host folders in
their order.

  python3 tests/check-fence.py [ROOT]
"""
import os
import re
import sys

FRONT_ENDS = ['src/cli', 'src/mcp', 'src/serve', 'src/oci']
OPEN = ['src/common', 'src/proto']
# The library's public headers a front end may include, and what each is
# (one not in the tree is skipped).
PUBLIC = {
    'src/controller/controller.h': "the controller's API",
    'src/controller/lifecycle.h': "controller.h's types: a sandbox's states and the lifecycle's pure decisions",
    'src/controller/controller-prepare.h': "preparation's phases and run (controller.h's prepare calls; capsule prepare runs it)",
    'src/sandbox/workspace-types.h': "the workspace's types controller.h's results carry",
    'src/sandbox/sandbox.h': 'one sandbox: spec, options, boot, exec, files',
    'src/sandbox/named.h': 'named sandboxes: records, create, start, stop, remove',
    'src/sandbox/xfer.h': 'files in and out of a sandbox (capsule cp)',
    'src/sandbox/workspace.h': "a sandbox's /workspace: diff and merge",
    'src/engine/engine-types.h': "the engine's types sandbox.h names (no function, no jail)",
    'src/engine/engine-probe.h': 'what a front end may ask the engine and the jail without a VM (doctor, --accel)',
    'src/store/store.h': "the store's API: images, pulls, the kernel's and initramfs's paths",
    'src/tree/tree.h': 'manifests, diff and merge (pure)',
    'src/net/policy.h': 'the network policy: parse, describe (pure)',
    'src/net/sniff.h': "HTTP/1.x request heads and TLS ClientHellos read from bytes (pure; serve's metrics endpoint reads its requests with the head parser)",
}
# Other front ends' headers a front end may include, by folder.
ENTRY = {
    'src/cli': ['src/mcp/mcp.h', 'src/serve/serve.h', 'src/oci/oci.h'],
    'src/mcp': ['src/serve/serve.h'],
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


class Tree:
    """The source tree at root, with files replaced by planted (path: text)."""

    def __init__(self, root, planted=None):
        self.root = root
        self.planted = planted or {}
        text = self.read('meson.build') or ''
        m = re.search(r'inc_host\s*=\s*include_directories\(([^)]*)\)', text)
        self.dirs = re.findall(r"'([^']+)'", m.group(1)) if m else []

    def read(self, path):
        if path in self.planted:
            return self.planted[path]
        try:
            with open(os.path.join(self.root, path), encoding='utf-8') as f:
                return f.read()
        except OSError:
            return None

    def exists(self, path):
        return path in self.planted or os.path.isfile(os.path.join(self.root, path))

    def resolve(self, frm, quote, name):
        """The tree's header an include names, or None (a system header)."""
        if quote == '"':
            here = os.path.normpath(os.path.join(os.path.dirname(frm), name))
            if self.exists(here):
                return here
        for d in self.dirs:
            p = os.path.normpath(os.path.join(d, name))
            if self.exists(p):
                return p
        return None

    def includes(self, path):
        """(line number, header path) for each of path's includes of the tree's headers."""
        out = []
        for n, line in enumerate((self.read(path) or '').split('\n'), 1):
            m = INCLUDE.match(line)
            if m:
                h = self.resolve(path, m.group(1), m.group(2))
                if h:
                    out.append((n, h))
        return out

    def files(self, top):
        """The .c and .h files under folder top, its subfolders included."""
        found = {p for p in self.planted if p.startswith(top + '/')}
        for d, _, names in os.walk(os.path.join(self.root, top)):
            rel = os.path.relpath(d, self.root)
            found |= {os.path.normpath(os.path.join(rel, n)) for n in names}
        return sorted(p for p in found if p.endswith(('.c', '.h')))


def folder(path):
    """The front end or library folder path belongs to (src/X)."""
    return '/'.join(path.split('/')[:2]) if path.startswith('src/') else os.path.dirname(path)


def internal(path):
    return re.search(r'-(internal|int)\.h$', path) is not None


def why_not(h, own):
    """Why a file of folder own (None: a public header) may not include h, or None if it may."""
    if folder(h) in OPEN or h in PUBLIC:
        return None
    if own is not None and (folder(h) == own or h in ENTRY.get(own, [])):
        return None
    base = os.path.basename(h)
    if base in ('engine.h', 'jail.h'):
        return ('the engine and the jail are not for front ends: engine-types.h has the types, '
                'engine-probe.h what may be asked without a VM')
    if internal(h):
        return "another folder's internal header"
    if folder(h) in FRONT_ENDS:
        return ("another front end's header: src/cli includes only the others' entry points "
                "(mcp.h, serve.h, oci.h), src/mcp only serve.h")
    if own is None:
        return 'a public header includes only src/common, src/proto and other public headers'
    return ("not a public header: a front end includes its own folder's headers, src/common, "
            "src/proto and the public headers listed in tests/check-fence.py")


def check_file(tree, path):
    """Failures of a front-end file's own includes: 'file:line: ...' lines."""
    own = folder(path)
    out = []
    for n, h in tree.includes(path):
        r = why_not(h, own)
        if r:
            out.append('%s:%d: includes %s: %s' % (path, n, h, r))
    return out


def check_public(tree, top):
    """Failures among the includes of public header top and of every header it reaches."""
    out, seen = [], {top}
    todo = [(top, [])]
    while todo:
        path, chain = todo.pop(0)
        for n, h in tree.includes(path):
            step = chain + ['%s:%d' % (path, n)]
            r = why_not(h, None)
            if r:
                via = '' if path == top else ' (reached from %s: %s)' % (
                    top, ' -> '.join(step))
                out.append('%s:%d: includes %s%s: %s' % (path, n, h, via, r))
            elif h not in seen:
                seen.add(h)
                todo.append((h, step))
    return out


def check(tree):
    """(name, failures) for every test."""
    tests = []
    for fe in FRONT_ENDS:
        for p in tree.files(fe):
            tests.append((p, check_file(tree, p)))
    for p in sorted(PUBLIC):
        if tree.exists(p):
            tests.append(('%s reaches only public headers' % p, check_public(tree, p)))
    return tests


def plant(tree, path, after, line):
    """path's text with line added after its first line starting with after."""
    text = tree.read(path)
    i = text.index('\n' + after) + 1
    j = text.index('\n', i) + 1
    return text[:j] + line + '\n' + text[j:], text[:j].count('\n') + 1


def self_tests(root):
    """The check fails on a planted front-end include and on a planted
    include that a public header passes on."""
    out = []
    base = Tree(root)
    text, n = plant(base, 'src/cli/main.c', '#include "', '#include "engine.h"')
    fails = [f for _, fs in check(Tree(root, {'src/cli/main.c': text})) for f in fs]
    want = 'src/cli/main.c:%d: includes src/engine/engine.h: the engine' % n
    out.append(('a planted #include "engine.h" in src/cli/main.c fails (%s)' % want,
                any(f.startswith(want) for f in fails)))
    text, n = plant(base, 'src/tree/tree.h', '#include "', '#include "jail.h"')
    fails = [f for _, fs in check(Tree(root, {'src/tree/tree.h': text})) for f in fs]
    want = 'src/tree/tree.h:%d: includes src/engine/jail.h (reached from ' % n
    out.append(('a planted #include "jail.h" in src/tree/tree.h fails through the public headers that include it',
                any(f.startswith(want) for f in fails)))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    tree = Tree(root)
    if not tree.dirs:
        print('1..1\nnot ok 1 - no inc_host in %s/meson.build' % root)
        return 1
    tests = check(tree)
    selftests = self_tests(root)
    print('1..%d' % (len(tests) + len(selftests)))
    k, failed = 0, 0
    for name, fails in tests:
        k += 1
        print('%s %d - %s' % ('not ok' if fails else 'ok', k, name))
        for f in fails:
            print('# ' + f)
        failed += bool(fails)
    for name, ok in selftests:
        k += 1
        print('%s %d - %s' % ('ok' if ok else 'not ok', k, name))
        failed += not ok
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
