#!/usr/bin/env python3
"""The guest's layout in one place (issue 32): no C file under src/ or
guest/ but the table (src/proto/layout.h) spells a path of it as a value.
TAP: one test per folder, and one that plants a literal to show the check
fails.

The rule. The paths are the string macros of layout.h (CAP_GUEST_WORK
"/work", CAP_GUEST_WORKSPACE, CAP_GUEST_SOURCE, the overlay's parts). A
string literal in code whose text is one of them, or one of them followed
by "/" and more, is a second copy of the table and fails, naming
file:line and the macro to use. Prose that mentions a path inside a longer
text (a help line, a message) is for people and is not checked; comments
are not code.

  python3 tests/check-layout.py [ROOT]
"""
import os
import re
import sys

TABLE = 'src/proto/layout.h'
STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"|/\*.*?\*/|//[^\n]*', re.S)
MACRO = re.compile(r'^#define\s+(CAP_GUEST_\w+)\s+"([^"]+)"', re.M)


def paths(root):
    with open(os.path.join(root, TABLE)) as f:
        return {v: k for k, v in MACRO.findall(f.read()) if v.startswith('/')}


def offences(text, known):
    """(line, literal, macro) for each literal that is a layout path."""
    out = []
    for m in STRING.finditer(text):
        t = m.group(0)
        if not t.startswith('"'):
            continue
        body = t[1:-1]
        for p, name in known.items():
            if body == p or body.startswith(p + '/'):
                out.append((text.count('\n', 0, m.start()) + 1, t, name))
                break
    return out


def files(root, top):
    for d, _, names in os.walk(os.path.join(root, top)):
        for n in sorted(names):
            if n.endswith(('.c', '.h')):
                path = os.path.relpath(os.path.join(d, n), root)
                if path != TABLE:
                    yield path


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    known = paths(root)
    folders = sorted({os.path.dirname(p) for top in ('src', 'guest') for p in files(root, top)})
    print('1..%d' % (len(folders) + 2))
    n = 0
    bad = 0
    for folder in folders:
        n += 1
        found = []
        for p in files(root, folder):
            if os.path.dirname(p) != folder:
                continue
            with open(os.path.join(root, p)) as f:
                found += ['%s:%d: %s is the layout\'s %s (layout.h): use it' % (p, line, lit, name)
                          for line, lit, name in offences(f.read(), known)]
        print('%sok %d - %s spells no guest path of its own' % ('not ' if found else '', n, folder))
        for line in found:
            print('# ' + line)
        bad += bool(found)
    n += 1
    ok = len(known) >= 3 and all(p in known for p in ('/work', '/workspace', '/source'))
    print('%sok %d - layout.h names /work, /workspace and /source (%d paths)' % ('' if ok else 'not ', n, len(known)))
    bad += not ok
    n += 1
    planted = offences('static const char *r = "/work";\nx = "/workspace/a"; /* "/source" */\n'
                       'puts("the data at /source");\n', known)
    ok = [(l, name) for l, _, name in planted] == [(1, 'CAP_GUEST_WORK'), (2, 'CAP_GUEST_WORKSPACE')]
    print('%sok %d - a planted "/work" and "/workspace/a" fail, a comment and prose do not' % ('' if ok else 'not ', n))
    bad += not ok
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
