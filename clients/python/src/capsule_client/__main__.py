"""python3 -m capsule_client SOCKET METHOD [JSON-PARAMS]

Sends one request to `capsule serve` and prints its result as JSON on
stdout (exit 0). An error answer is printed as the JSON-RPC error object
on stdout with exit 1; a connection that fails exits 2. `progress`
notifications (prepare, or a call that prepares first) go to stderr, one
line each. --raw prints the whole response instead of its result."""

import json
import sys
from typing import List, Optional

from .client import Client
from .errors import CapsuleError, ConnectionLost
from .types import Progress

USAGE = "usage: python3 -m capsule_client [--raw] [--timeout SECONDS] SOCKET METHOD [JSON-PARAMS]"


def _progress(p: Progress) -> None:
    line = f"{p.phase}: {p.status} ({p.done}/{p.total})"
    if p.message:
        line += f" {p.message}"
    print(line, file=sys.stderr, flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    raw = False
    timeout = None
    while args and args[0].startswith("--"):
        opt = args.pop(0)
        if opt == "--raw":
            raw = True
        elif opt == "--timeout":
            if not args:
                print(f"capsule_client: --timeout needs SECONDS\n{USAGE}", file=sys.stderr)
                return 2
            value = args.pop(0)
            try:
                timeout = float(value)
            except ValueError:
                timeout = None
            if timeout is None or not 0 < timeout < float("inf"):
                print(f"capsule_client: --timeout {value!r} is not a number of seconds above 0 "
                      f"(e.g. --timeout 30 or 0.5)", file=sys.stderr)
                return 2
        elif opt in ("--help", "-h"):
            print(USAGE)
            print(__doc__.split("\n", 2)[2].strip())
            return 0
        else:
            print(f"capsule_client: unknown option {opt}\n{USAGE}", file=sys.stderr)
            return 2
    if len(args) not in (2, 3):
        print(USAGE, file=sys.stderr)
        return 2
    sock, method = args[0], args[1]
    try:
        params = json.loads(args[2]) if len(args) == 3 else None
    except ValueError as e:
        print(f"capsule_client: JSON-PARAMS is not JSON: {e}", file=sys.stderr)
        return 2
    try:
        with Client(sock) as c:
            call = c.submit(method, params, on_progress=_progress)
            try:
                result = call.result(timeout)
            except ConnectionLost:
                raise
            except CapsuleError as e:
                err = {"code": e.code, "message": e.message}
                if e.data is not None:
                    err["data"] = e.data
                print(json.dumps({"jsonrpc": "2.0", "id": call.id, "error": err} if raw else err))
                return 1
    except ConnectionLost as e:
        print(f"capsule_client: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"jsonrpc": "2.0", "id": call.id, "result": result} if raw else result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
