#!/usr/bin/env python3
"""Which verbs take --json, asked of every place that says so: the
binary itself (each verb and sub-verb run with --json: accepted or
refused as an unknown option), each verb's --help (its synopsis and
sub-command list), the "Output:" paragraph of `capsule --help` (made from
the verb table in src/cli/main.c), docs/cli.md ("JSON output": its list
and the documented shapes) and the man pages scripts/gen-man.sh makes.
All must name the same verbs. Where --json needs no VM and no network
(ls, inspect, image ls, image inspect, image outdated, template ls,
doctor, prepare with its kernel builder missing), its output must parse as JSON of the
documented kind. A throwaway CAPSULE_HOME and CAPSULE_CACHE; a tiny
imported image and a created (never started) sandbox. TAP output.

    python3 tests/integration/test-cli-json.py build/capsule"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORD = re.compile(r"[a-z][a-z-]*")

n = 0
failed = 0


def ok(cond, name, detail=()):
    global n, failed
    n += 1
    print(f"{'ok' if cond else 'not ok'} {n} - {name}", flush=True)
    if not cond:
        failed += 1
        for line in [x for x in detail if x][:20]:
            print(f"# {line}", flush=True)
    return cond


def names_list(text):
    """"a, b c and d" -> ["a", "b c", "d"]."""
    text = " ".join(text.split())
    return [x.strip() for x in re.split(r",\s*|\s+and\s+", text) if x.strip()]


def json_names(verb, forms):
    """The verbs a verb's synopsis forms give --json: VERB for a form of
    the verb itself, "VERB SUB" for a form that starts with a sub-verb
    (a lowercase word), e.g. "ls [--json]" in image's list."""
    out = set()
    for f in forms:
        if "--json" not in f:
            continue
        first = f.split()[0] if f.split() else ""
        out.add(f"{verb} {first}" if WORD.fullmatch(first) else verb)
    return out


def sub_verbs(forms):
    return {f.split()[0] for f in forms if f.split() and WORD.fullmatch(f.split()[0])}


def strip_prefix(verb, form):
    form = form.strip()
    for p in (f"capsule {verb}", "capsule-oci" if verb == "oci" else None):
        if p and (form == p or form.startswith(p + " ")):
            return form[len(p):].strip()
    return form


def help_forms(verb, text):
    """The synopsis forms of a verb's --help: the Usage: lines (each
    split at " | ") and the tags of its sub-command list (lines indented
    two spaces that start with a lowercase word, the tag ending at a run
    of two spaces) when the synopsis is VERB COMMAND."""
    lines = text.splitlines()
    usage = [lines[0][len("Usage:"):]]
    i = 1
    while i < len(lines) and lines[i].startswith(" ") and lines[i].strip():
        usage.append(lines[i])
        i += 1
    forms = [strip_prefix(verb, f) for u in usage for f in u.split(" | ")]
    if by_command(forms):
        for line in lines[i:]:
            if re.match(r"^  [a-z]", line):
                forms.append(re.split(r"\s{2,}", line.strip())[0])
    return forms


def by_command(forms):
    """Whether the synopsis is "capsule VERB COMMAND", its sub-commands
    listed below it (image), rather than each written out (template)."""
    return any(f.split()[:1] == ["COMMAND"] for f in forms)


def unroff(s):
    s = re.sub(r"\\f(\[[^]]*\]|.)", "", s)
    s = s.replace("\\-", "-").replace("\\&", "").replace("\\%", "").replace("\\(dq", '"')
    return s.replace("\\e", "\\")


def man_forms(verb, page):
    """The same forms from a generated page: its SYNOPSIS lines and, as
    above, the tags of its .TP entries."""
    lines = page.splitlines()
    forms, tags = [], []
    syn = False
    for i, line in enumerate(lines):
        if line.startswith(".SH"):
            syn = line.strip() == ".SH SYNOPSIS"
            continue
        if syn and not line.startswith("."):
            forms += [strip_prefix(verb, f) for f in unroff(line).split(" | ")]
        if line == ".TP" and i + 1 < len(lines):
            tags.append(unroff(lines[i + 1]))
    return forms + (tags if by_command(forms) else [])


def man_text(page):
    return "\n".join(unroff(x) for x in page.splitlines() if not x.startswith("."))


def output_paragraph(text):
    m = re.search(r"Output:\s+(.*?)\s+take\s+--json", " ".join(text.split()))
    return set(names_list(m.group(1))) if m else None


def main():
    capsule = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/capsule")
    tmp = tempfile.mkdtemp(prefix="capsule-cli-json-")
    try:
        return run(capsule, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(capsule, tmp):
    env = dict(os.environ, CAPSULE_HOME=f"{tmp}/home", CAPSULE_CACHE=f"{tmp}/cache",
               # prepare must fail at its first phase, not build a kernel.
               CAPSULE_KERNEL=f"{tmp}/no-kernel", CAPSULE_KERNEL_BUILDER=f"{tmp}/no-builder",
               CAPSULE_TEMPLATES="0", NO_COLOR="1")

    def cap(*args, timeout=30):
        try:
            p = subprocess.run([capsule, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, env=env, timeout=timeout)
            return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
        except subprocess.TimeoutExpired:
            return None, "", f"still running after {timeout} s"

    # The verbs: the "Commands:" section of `capsule --help`, as gen-man.sh reads it.
    rc, top, err = cap("--help")
    ok(rc == 0 and top.startswith("Usage:"), "capsule --help prints its usage", [err])
    verbs = []
    section = None
    for line in top.splitlines():
        if re.match(r"^\S.*:$", line):
            section = line[:-1]
        elif section == "Commands" and line.startswith(" "):
            cells = re.split(r"\s{2,}", line.strip())
            verbs += [cells[i] for i in range(0, len(cells) - 1, 2) if WORD.fullmatch(cells[i])]
    verbs = [v for v in verbs if v not in ("version", "help")]
    ok(len(verbs) > 10, f"capsule --help lists the verbs ({len(verbs)})", [top])
    in_help = output_paragraph(top)
    ok(in_help is not None, "capsule --help has an \"Output: ... take --json\" paragraph", [top])
    in_help = in_help or set()

    # Each verb's --help: which of it takes --json, and its sub-verbs.
    helps, in_verb_help, candidates = {}, set(), []
    for v in verbs:
        rc, text, err = cap(v, "--help")
        helps[v] = text
        forms = help_forms(v, text) if text.startswith("Usage:") else []
        named = json_names(v, forms)
        mentions = "--json" in text
        ok(rc == 0 and text.startswith("Usage:") and mentions == bool(named),
           f"capsule {v} --help: --json for {', '.join(sorted(named)) or 'none'}",
           [f"exit {rc}, stderr {err.strip()!r}",
            "it mentions --json but no synopsis form of it has --json" if mentions and not named else ""])
        in_verb_help |= named
        candidates.append(v)
        candidates += [f"{v} {s}" for s in sorted(sub_verbs(forms))]

    # A tiny image and a sandbox made from it (no VM: create only makes disks).
    root = f"{tmp}/root"
    os.makedirs(f"{root}/bin")
    with open(f"{root}/bin/hello", "w") as f:
        f.write("hello\n")
    rc, out, err = cap("image", "import", root, "--name", "tiny", "-q")
    ok(rc == 0, "a tiny image imported", [err])
    rc, out, err = cap("create", "sb", "--image", "tiny")
    ok(rc == 0, "a sandbox created from it (not started)", [err])

    # Run each verb and sub-verb with --json: where its --json needs no
    # VM, the arguments that make it answer; elsewhere ones that would
    # fail fast (a sandbox that does not exist or has no workspace, a
    # template that does not exist) if --json were taken.
    argv = {
        "run": ["run", "--json", "--", "true"],
        "exec": ["exec", "--json", "nosuch", "--", "true"],
        "inspect": ["inspect", "--json", "sb"],
        "image inspect": ["image", "inspect", "tiny", "--json"],
        "template inspect": ["template", "inspect", "nosuch", "--json"],
        "snapshot inspect": ["snapshot", "inspect", "nosuch", "--json"],
        "fork": ["fork", "nosuch", "--json"],
        "diff": ["diff", "sb", "--json"],
        "mcp": ["mcp", "--agent", "a", "--json"],
        "cp": ["cp", "--json", f"{tmp}/root/bin/hello", "nosuch:/tmp/x"],
        "image build": ["image", "build", "base", "--json"],
        "image pull": ["image", "pull", "127.0.0.1:1/nosuch:x", "--json", "--timeout", "1"],
        "image check": ["image", "check", "127.0.0.1:1/nosuch:x", "--json", "--timeout", "1"],
        "image import": ["image", "import", f"{tmp}/nosuch", "--json"],
        "source build": ["source", "build", f"{tmp}/nosuch", f"{tmp}/nosuch.img", "--json"],
    }
    one_operand = {"start", "stop", "shell", "logs", "rm", "merge", "net show", "net set", "net log",
                   "image rm", "source check", "create"}
    answers = {}
    accepted = set()
    for c in candidates:
        args = argv.get(c) or c.split() + (["nosuch"] if c in one_operand else []) + ["--json"]
        rc, out, err = cap(*args)
        answers[c] = (rc, out, err)
        refused = rc is not None and rc != 0 and not out.strip() and \
            ("--json" in err or err.lstrip().startswith("Usage:"))
        if not refused:
            accepted.add(c)
        said = c in in_verb_help
        ok(rc is not None and said == (not refused),
           f"capsule {' '.join(args)}: {'taken' if not refused else 'refused'}, as its --help says",
           [f"exit {rc}; stdout {out[:200]!r}; stderr {err[:300]!r}",
            f"its --help {'documents' if said else 'does not document'} --json"])

    # The output of those that need no VM.
    def shape(name, want_rc, check):
        rc, out, err = answers.get(name, (None, "", "not run: not a verb of capsule --help"))
        try:
            doc = json.loads(out)
            why = check(doc, rc)
        except ValueError as e:
            doc, why = None, f"not JSON ({e}): {out[:200]!r}"
        ok(why is None and (want_rc is None or rc == want_rc),
           f"{name} --json prints JSON of its documented shape",
           [why or "", f"exit {rc} (wanted {want_rc}); stderr {err[:300]!r}"])

    def is_(cond, why):
        return None if cond else why

    shape("ls", 0, lambda d, rc: is_(isinstance(d, list) and [x.get("name") for x in d] == ["sb"],
                                     f"not an array of sandbox sb: {d!r:.200}"))
    shape("inspect", 0, lambda d, rc: is_(isinstance(d, dict) and d.get("name") == "sb"
                                          and d.get("state") == "stopped", f"not sandbox sb, stopped: {d!r:.200}"))
    shape("image ls", 0, lambda d, rc: is_(isinstance(d, list) and [x.get("name") for x in d] == ["tiny"],
                                           f"not an array of image tiny: {d!r:.200}"))
    shape("image inspect", 0, lambda d, rc: is_(isinstance(d, dict) and d.get("name") == "tiny"
                                                and d.get("verified") is True, f"not image tiny, verified: {d!r:.200}"))
    shape("image outdated", 0, lambda d, rc: is_(d == [], f"not an empty array (no image pulled): {d!r:.200}"))
    shape("template ls", 0, lambda d, rc: is_(d == [], f"not an empty array: {d!r:.200}"))
    shape("doctor", None, lambda d, rc: is_(isinstance(d, dict) and isinstance(d.get("ok"), bool)
                                            and rc == (0 if d["ok"] else 1),
                                            f"no boolean \"ok\" matching exit {rc}: {d!r:.200}"))
    shape("prepare", 125, lambda d, rc: is_(isinstance(d, dict) and d.get("prepared") is False
                                            and d.get("phase") == "kernel" and isinstance(d.get("error"), str),
                                            f"not a failure at the kernel phase: {d!r:.300}"))

    # docs/cli.md, "JSON output": the list, and a documented shape (or a
    # pointer to one) for each.
    with open(os.path.join(TOP, "docs", "cli.md")) as f:
        md = f.read()
    m = re.search(r"^## JSON output\n(.*?)(?=^## )", md, re.S | re.M)
    sec = m.group(1) if m else ""
    lm = re.search(r"`--json` is taken by (.*?)[.;](?:\s|$)", sec, re.S)
    in_doc_list = set(re.findall(r"`([^`]+)`", lm.group(1))) if lm else set()
    in_doc_shapes = set()
    for span in re.findall(r"`([^`]*--json[^`]*)`", sec):
        words = [w for w in span.split("--json")[0].split() if WORD.fullmatch(w) and w != "capsule"]
        if words:
            in_doc_shapes.add(" ".join(words))

    # The man pages, made as the package makes them.
    man = f"{tmp}/man"
    p = subprocess.run(["sh", os.path.join(TOP, "scripts", "gen-man.sh"), capsule, man],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=120)
    ok(p.returncode == 0, "scripts/gen-man.sh made the man pages", [p.stderr.decode()])
    in_man_top, in_man_verbs, man_why = set(), set(), []
    try:
        with open(f"{man}/capsule.1") as f:
            in_man_top = output_paragraph(man_text(f.read())) or set()
        for v in verbs:
            with open(f"{man}/capsule-{v}.1") as f:
                page = f.read()
            named = json_names(v, man_forms(v, page))
            if ("--json" in man_text(page)) != bool(named):
                man_why.append(f"capsule-{v}.1 mentions --json but no synopsis form of it has it")
            in_man_verbs |= named
    except OSError as e:
        man_why.append(str(e))

    def same(name, got, why=()):
        ok(got == accepted and not why, f"{name}: the verbs that take --json are the binary's",
           list(why) + [f"missing: {', '.join(sorted(accepted - got))}" if accepted - got else "",
                        f"not taking it: {', '.join(sorted(got - accepted))}" if got - accepted else ""])

    print(f"# taken by: {', '.join(sorted(accepted))}", flush=True)
    same("capsule --help (Output:)", in_help)
    same("the verbs' --help", in_verb_help)
    same("docs/cli.md's list (JSON output)", in_doc_list,
         [] if lm else ["no \"`--json` is taken by ...\" sentence under \"## JSON output\""])
    same("docs/cli.md's shapes (JSON output)", in_doc_shapes)
    same("capsule(1) (Output:)", in_man_top)
    same("the capsule-VERB(1) pages", in_man_verbs, man_why)
    print(f"1..{n}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
