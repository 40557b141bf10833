#!/bin/sh
# Generate the man pages from the help texts: capsule.1 from `capsule
# --help` and capsule-VERB.1 from `capsule VERB --help` for every verb that
# `capsule --help` lists (so the pages cannot drift from the binary).
#
#   scripts/gen-man.sh BUILD/capsule OUTDIR
#
# Writes OUTDIR/capsule.1 and OUTDIR/capsule-VERB.1 (uncompressed) and
# prints the verbs, one a line. The page date is SOURCE_DATE_EPOCH's when
# set (reproducible builds), else today's. Fails, naming the verb, when a
# verb's --help does not start with a "Usage:" line.
set -eu

[ $# -eq 2 ] || { echo "usage: $0 CAPSULE OUTDIR" >&2; exit 2; }
capsule=$1
outdir=$2
[ -x "$capsule" ] || { echo "gen-man: $capsule is not an executable; build it first (make build)" >&2; exit 1; }
mkdir -p "$outdir"

exec python3 - "$capsule" "$outdir" <<'PY'
import os, re, subprocess, sys, time

capsule, outdir = sys.argv[1], sys.argv[2]

def helptext(*args):
    p = subprocess.run([capsule, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL, timeout=30, env=dict(os.environ, NO_COLOR="1"))
    text = p.stdout.decode("utf-8", "replace")
    if p.returncode != 0 or not text.startswith("Usage:"):
        cmd = " ".join(["capsule", *args])
        sys.exit(f"gen-man: `{cmd}` exited {p.returncode} and printed no Usage: line first "
                 f"(got: {text.splitlines()[0] if text else 'nothing'!r}); fix its help text")
    return text.expandtabs()

version = subprocess.run([capsule, "--version"], stdout=subprocess.PIPE, check=True,
                         timeout=30).stdout.decode().split()[1]
epoch = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
date = time.strftime("%Y-%m-%d", time.gmtime(epoch))

# The verbs and their one-line summaries: the "Commands:" section of
# `capsule --help`, two columns per line at most, columns split by runs
# of two or more spaces. `version` and `help` are options, documented in
# capsule(1).
top = helptext("--help")
verbs = {}
section = None
for line in top.splitlines():
    if re.match(r"^\S.*:$", line):
        section = line[:-1]
        continue
    if section != "Commands" or not line.startswith(" "):
        continue
    cells = re.split(r"\s{2,}", line.strip())
    for i in range(0, len(cells) - 1, 2):
        if re.fullmatch(r"[a-z][a-z-]*", cells[i]):
            verbs[cells[i]] = cells[i + 1]
for v in ("version", "help"):
    verbs.pop(v, None)
if not verbs:
    sys.exit("gen-man: no verbs found under Commands: in `capsule --help`")

def esc(s):
    """Escape text for roff: backslashes, and the hyphens of options
    (words starting with '-') as minus signs so that they can be copied."""
    s = s.replace("\\", "\\e")
    s = re.sub(r"(?<![\w-])-[\w-]*", lambda m: m.group(0).replace("-", "\\-"), s)
    return s

def line_out(s):
    s = esc(s)
    return "\\&" + s if s[:1] in (".", "'") else s

def tag(s):
    """An option's tag: the option names bold, their arguments as written."""
    s = esc(s)
    s = re.sub(r"(?<![\w\\])((?:\\-)+[\w\\-]*)", r"\\fB\1\\fR", s)
    return "\\&" + s if s[:1] in (".", "'") else s

HEADING = re.compile(r"^[A-Z][^:]*:$")
ITEM = re.compile(r"^( *)(\S.*?)(?:\s{2,}(\S.*))?$")

def indent_of(s):
    return len(s) - len(s.lstrip())

def is_table(s):
    """A line of several columns (two or more gaps of two spaces or more
    inside it), as in a table of short entries: kept as written."""
    return len(re.findall(r"\S\s{2,}(?=\S)", s.strip())) >= 2

def item(s, nxt=None):
    """(indent, tag, description or None) when the line starts an entry
    of a list: an option ("  -r, --recursive  Copy ..."), or a word and
    its arguments, two spaces, a description ("  ls   List images";
    unindented, one word only: "show  Print ..."), or a word and its
    arguments alone with the description below, indented deeper (nxt,
    the next line). None otherwise."""
    m = ITEM.match(s)
    if not m or is_table(s):
        return None
    ind, t, d = len(m.group(1)), m.group(2), m.group(3)
    if ind > 4 or (d and d.startswith("#")):
        return None
    if t.startswith("-") and ind > 0:
        return ind, t, d
    if t.split()[0] == "capsule":
        return None
    if not d:
        if ind > 0 and nxt and nxt.strip() and indent_of(nxt) >= ind + 8 \
                and re.fullmatch(r"[a-z][\w-]*(?: \S+)*", t):
            return ind, t, None
        return None
    if len(t) > 40:
        return None
    if ind == 0:
        return (0, t, d) if re.fullmatch(r"[a-z][a-z-]*", t) else None
    return (ind, t, d) if re.fullmatch(r"[A-Za-z][^ ]*(?: \S+)*", t) else None

def body(lines, commands=None):
    """The help text after the usage lines, as roff: headings as .SS,
    list entries as .TP (continuation lines, indented deeper, joined to
    the description), prose (unindented, or indented evenly as a note)
    as filled paragraphs, and any other indented run (tables, examples)
    kept as written. With
    commands, the "Commands:" section becomes one entry per verb."""
    out = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if HEADING.match(line):
            out.append('.SS "' + esc(line[:-1]).replace('"', "\\(dq") + '"')
            i += 1
            if commands and line == "Commands:":
                for v, summary in commands.items():
                    out += [".TP", "\\fB" + esc(v) + "\\fR",
                            line_out(summary) + " (\\%\\fBcapsule\\-" + esc(v) + "\\fR(1))."]
                while i < n and (lines[i].startswith(" ") or not lines[i].strip()):
                    i += 1
            continue
        nxt = lines[i + 1] if i + 1 < n else None
        it = item(line, nxt)
        if it:
            ind, t, d = it
            desc = [d] if d else []
            i += 1
            while i < n and lines[i].strip() and indent_of(lines[i]) > ind \
                    and not (item(lines[i]) and item(lines[i])[0] <= ind + 2 and not t.startswith("-") ) \
                    and not (lines[i].lstrip().startswith("-") and indent_of(lines[i]) <= ind + 2):
                desc.append(lines[i].strip())
                i += 1
            out += [".TP", tag(t)] + [line_out(x) for x in desc]
            continue
        if not line.startswith(" "):
            out.append(".PP")
            while i < n and lines[i].strip() and not lines[i].startswith(" ") \
                    and not HEADING.match(lines[i]) and not item(lines[i], lines[i + 1] if i + 1 < n else None):
                out.append(line_out(lines[i]))
                i += 1
            continue
        # An indented run that is not a list: kept as written, relative to
        # its least indented line.
        run = []
        while i < n and lines[i].strip() and lines[i].startswith(" ") \
                and (not item(lines[i], lines[i + 1] if i + 1 < n else None) or any(is_table(r) for r in run)):
            run.append(lines[i])
            i += 1
        base = min(indent_of(r) for r in run)
        if all(indent_of(r) == base for r in run) and not run[0].lstrip().startswith("capsule ") \
                and not any(is_table(r) or "#" in r for r in run):
            # Prose indented as a note: filled like any paragraph.
            out += [".PP"] + [line_out(r.strip()) for r in run]
            continue
        out += [".PP", ".RS 2", ".nf"] + [line_out(r[base:]) for r in run] + [".fi", ".RE"]
    return out

def page(name, summary, text, extra, commands=None):
    lines = text.splitlines()
    usage = [lines[0][len("Usage:"):].strip()]
    i = 1
    while i < len(lines) and lines[i].startswith(" ") and lines[i].strip():
        usage.append(lines[i].strip())
        i += 1
    summary = summary[:1].lower() + summary[1:]
    r = [f'.\\" Generated by scripts/gen-man.sh from `{name.replace("-", " ", 1)} --help`; do not edit.',
         f'.TH {name.upper()} 1 "{date}" "capsule {version}" "User Commands"',
         ".\\\" Options and paths read better unhyphenated and ragged-right.",
         ".nh", ".ad l",
         ".SH NAME", f"{name} \\- {esc(summary)}",
         ".SH SYNOPSIS", ".nf"]
    for u in usage:
        m = re.match(r"^(capsule(?: [a-z][a-z-]*)?)(.*)$", u)
        if m and m.group(1).split()[1:2] == name.split("-")[1:2]:
            r.append("\\fB" + esc(m.group(1)) + "\\fR" + esc(m.group(2)))
        else:
            r.append(line_out(u))
    r += [".fi", ".SH DESCRIPTION"]
    r += body(lines[i:], commands)
    r += extra
    with open(os.path.join(outdir, name + ".1"), "w") as f:
        f.write("\n".join(r) + "\n")

docs = "/usr/share/doc/capsule"
see_verbs = ",\n".join(f"\\%\\fBcapsule\\-{esc(v)}\\fR(1)" for v in sorted(verbs))
page("capsule", "private microVMs for AI agents' tools", top, [
    ".SH FILES",
    ".TP", "\\fI~/.local/share/capsule/\\fR",
    "Images, sandboxes and the socket of \\fBcapsule serve\\fR (\\fBCAPSULE_HOME\\fR).",
    ".TP", "\\fI~/.cache/capsule/\\fR",
    "The guest kernel, initramfs and template snapshots (\\fBCAPSULE_CACHE\\fR).",
    ".TP", "\\fI/usr/share/capsule/guest/build\\-kernel.sh\\fR",
    "Builds the guest kernel into the cache from Debian's linux\\-source\\-6.1 "
    "(minutes, once); \\fBcapsule doctor\\fR says whether it is needed.",
    ".TP", "\\fI/usr/lib/capsule/capsule\\-agent\\fR",
    "The static guest agent (PID 1 in every VM).",
    ".SH SEE ALSO", see_verbs + ".",
    ".PP", f"README.md and the guides in \\fI{docs}/docs/\\fR (architecture, serve, mcp, "
    "network, images, workspace, packaging...).",
], verbs)
for v, summary in verbs.items():
    page("capsule-" + v, summary, helptext(v, "--help"),
         [".SH SEE ALSO", "\\fBcapsule\\fR(1)"])
    print(v)
PY
