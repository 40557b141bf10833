"""The serve methods, written once for Client and AsyncClient: each builds
its params and hands them to self._invoke, which answers with the result
(Client) or an awaitable of it (AsyncClient)."""

import base64
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from .errors import InvalidParams
from .types import (DiffResult, DirectoryListing, ExecResult, FileResult, ForkResult, IdentityLike,
                    ImageCheck, LifecycleResult, MergeResult, PrepareResult, Progress, SandboxList,
                    ServerInfo, SizeResult, SnapshotResult, Status, TransferResult, WriteResult, identity_json)

INLINE_MAX = 16 * 1024 * 1024        # an inline upload or download (docs/serve.md)
LINE_MAX = 24 * 1024 * 1024          # a request line the server reads

ProgressCallback = Callable[[Progress], Any]


def _put(params: Dict[str, Any], **kw: Any) -> Dict[str, Any]:
    """params with the keyword arguments that are not None."""
    for k, v in kw.items():
        if v is not None:
            params[k] = v
    return params


def _durable(params: Dict[str, Any], durable: bool) -> None:
    """"durable": false only when asked: the server's default is true."""
    if not isinstance(durable, bool):
        raise TypeError(f"durable must be True or False, not {durable!r}")
    if not durable:
        params["durable"] = False


def _pathname(p: Union[str, "os.PathLike[str]"]) -> str:
    return os.fspath(p)


class Methods:
    """Typed methods of every `capsule serve` method (docs/serve.md).

    Every method also takes, as keywords: call_timeout (seconds to wait for
    the answer; then `cancel` is sent and CallTimeout raised), cancel (a
    token: a threading.Event for Client, an asyncio.Event for AsyncClient;
    setting it sends `cancel` and raises Cancelled) and on_progress (called
    with each Progress notification of this call: a tool call that reaches
    an unprepared server builds what is missing first and says so)."""

    def _invoke(self, method: str, params: Optional[Dict[str, Any]], wrap: Any, **opts: Any) -> Any:
        raise NotImplementedError

    # -- tool methods: one identity's sandbox ---------------------------------

    def exec(self, identity: IdentityLike, argv: Sequence[str], *, env: Optional[Dict[str, str]] = None,
             cwd: Optional[str] = None, timeout: Optional[float] = None, stdin: Optional[str] = None,
             pids_max: Optional[int] = None, durable: bool = True,
             size: Optional[Dict[str, int]] = None, **opts: Any) -> ExecResult:
        """Run argv in the identity's sandbox (timeout: the command's, in
        seconds, default 30 on the server). The answer comes once what the
        command wrote is on the host's disk; durable=False returns sooner
        and gives that up (result.durable says which). size: as set_size's,
        checked and kept before the command runs (result.size)."""
        if isinstance(argv, (str, bytes)):
            raise TypeError("argv must be a list of strings, e.g. ['sh', '-c', 'echo hi']")
        p = _put({"identity": identity_json(identity), "argv": list(argv)},
                 env=env, cwd=cwd, timeout=timeout, stdin=stdin, pids_max=pids_max, size=size)
        _durable(p, durable)
        return self._invoke("exec", p, ExecResult.from_json, **opts)

    def read_file(self, identity: IdentityLike, path: str, *, root: Optional[str] = None,
                  max_bytes: Optional[int] = None, **opts: Any) -> FileResult:
        """A UTF-8 text file (or a directory's entries); root "public"
        (/source, default) or "workspace" (/work)."""
        p = _put({"identity": identity_json(identity), "path": path}, root=root, max_bytes=max_bytes)
        return self._invoke("read_file", p, FileResult.from_json, **opts)

    def list_directory(self, identity: IdentityLike, path: Optional[str] = None, *,
                       root: Optional[str] = None, **opts: Any) -> DirectoryListing:
        p = _put({"identity": identity_json(identity)}, path=path, root=root)
        return self._invoke("list_directory", p, DirectoryListing.from_json, **opts)

    def write_file(self, identity: IdentityLike, path: str, content: str, *, durable: bool = True,
                   **opts: Any) -> WriteResult:
        """Write UTF-8 text (at most 60000 bytes) to path in /work (on the
        host's disk when it returns, unless durable=False)."""
        p = {"identity": identity_json(identity), "path": path, "content": content}
        _durable(p, durable)
        return self._invoke("write_file", p, WriteResult.from_json, **opts)

    def upload(self, identity: IdentityLike, path: str, content: Union[bytes, str, None] = None, *,
               from_path: Optional[Union[str, "os.PathLike[str]"]] = None, root: Optional[str] = None,
               mode: Union[int, str, None] = None, durable: bool = True, **opts: Any) -> TransferResult:
        """Put one file's bytes (content, at most 16 MiB; a str is sent as
        UTF-8) at path, or copy from_path (a host file or directory inside
        one of the server's --transfer-dir) there. root "workspace" (/work,
        default) or "project" (/workspace). mode: an int (0o755) or "0755".
        What was copied is on the host's disk when it returns, unless
        durable=False."""
        if (content is None) == (from_path is None):
            raise TypeError("upload takes exactly one of content and from_path")
        p = _put({"identity": identity_json(identity), "path": path}, root=root)
        if content is not None:
            data = content.encode() if isinstance(content, str) else bytes(content)
            if len(data) > INLINE_MAX:
                raise InvalidParams(-32602, f"an inline upload is at most {INLINE_MAX} bytes, this one has "
                                    f"{len(data)}: put the file in a --transfer-dir and use from_path",
                                    {"local": True})
            p["content_base64"] = base64.b64encode(data).decode("ascii")
            if mode is not None:
                p["mode"] = format(mode, "04o") if isinstance(mode, int) else mode
        else:
            p["from"] = _pathname(from_path)
        _durable(p, durable)
        return self._invoke("upload", p, TransferResult.from_json, **opts)

    def download(self, identity: IdentityLike, path: str, *, root: Optional[str] = None,
                 to: Optional[Union[str, "os.PathLike[str]"]] = None, **opts: Any) -> TransferResult:
        """One file's bytes in .content (at most 16 MiB), or, with to (a
        path inside a --transfer-dir that does not exist yet), the file or
        tree written there. root "workspace" (default), "project", "public"."""
        p = _put({"identity": identity_json(identity), "path": path}, root=root,
                 to=_pathname(to) if to is not None else None)
        return self._invoke("download", p, TransferResult.from_json, **opts)

    def diff(self, identity: IdentityLike, **opts: Any) -> DiffResult:
        """What the sandbox changed in /workspace (server with --workspace)."""
        return self._invoke("diff", {"identity": identity_json(identity)}, DiffResult.from_json, **opts)

    def merge(self, identity: IdentityLike, *, pick: Optional[str] = None, dry_run: Optional[bool] = None,
              **opts: Any) -> MergeResult:
        """Merge the sandbox's /workspace changes into the server's
        --workspace; pick "refuse" (default), "theirs" or "ours".
        Conflicts raise ToolRefused with .conflicts."""
        p = _put({"identity": identity_json(identity)}, pick=pick, dry_run=dry_run)
        return self._invoke("merge", p, MergeResult.from_json, **opts)

    # -- lifecycle and the controller -----------------------------------------

    def set_size(self, identity: IdentityLike, size: Dict[str, int], **opts: Any) -> SizeResult:
        """The identity's own sizes ({"cpus", "memory_mib", "root_mib",
        "work_mib"}, any of them): refused now (InvalidParams naming the
        bound) when beyond the server's or the host's bounds, else kept and
        applied at its sandbox's next start; a running VM is not resized
        (result.size.pending says so)."""
        if not isinstance(size, dict) or not size:
            raise TypeError("size must be a dict such as {'cpus': 2, 'memory_mib': 2048}")
        return self._invoke("set_size", {"identity": identity_json(identity), "size": dict(size)},
                            SizeResult.from_json, **opts)

    def snapshot(self, identity: IdentityLike, *, name: Optional[str] = None, **opts: Any) -> SnapshotResult:
        """Save the identity's running sandbox (memory, processes, disks)
        after its earlier calls; name defaults to the server's choice."""
        return self._invoke("snapshot", _put({"identity": identity_json(identity)}, name=name),
                            SnapshotResult.from_json, **opts)

    def fork(self, identity: IdentityLike, count: Optional[int] = None, *,
             peers: Optional[Sequence[str]] = None, **opts: Any) -> ForkResult:
        """Branch the identity's sandbox: count new identities of the same
        agent (peers as given, else "<peer>-N"), each a sandbox that goes
        on from this one's state, processes included."""
        p = _put({"identity": identity_json(identity)}, count=count,
                 peers=list(peers) if peers is not None else None)
        return self._invoke("fork", p, ForkResult.from_json, **opts)

    def status(self, identity: IdentityLike, **opts: Any) -> Status:
        """The identity's sandbox state; creates nothing."""
        return self._invoke("status", {"identity": identity_json(identity)}, Status.from_json, **opts)

    def list(self, **opts: Any) -> SandboxList:
        return self._invoke("list", None, SandboxList.from_json, **opts)

    def info(self, **opts: Any) -> ServerInfo:
        return self._invoke("info", None, ServerInfo.from_json, **opts)

    def stop(self, identity: Optional[IdentityLike] = None, *, sandbox: Optional[str] = None,
             **opts: Any) -> LifecycleResult:
        """Stop the identity's VM after its queued calls (disks kept), or
        name a sandbox this controller owns (the administrative form)."""
        return self._invoke("stop", self._who(identity, sandbox), LifecycleResult.from_json, **opts)

    def remove(self, identity: Optional[IdentityLike] = None, *, sandbox: Optional[str] = None,
               **opts: Any) -> LifecycleResult:
        """Stop the VM and delete its sandbox and disks."""
        return self._invoke("remove", self._who(identity, sandbox), LifecycleResult.from_json, **opts)

    def cancel(self, request_id: Any, **opts: Any) -> bool:
        """Cancel one of this connection's requests by id; whether it was
        found. (Calls are usually cancelled through their own cancel token,
        call_timeout, Call.cancel() or asyncio task cancellation.)"""
        return self._invoke("cancel", {"id": request_id}, lambda r: bool(r.get("cancelled")), **opts)

    def prepare(self, *, on_progress: Optional[ProgressCallback] = None, **opts: Any) -> PrepareResult:
        """Make sure kernel, initramfs, image and template exist, building
        what is missing (minutes for a kernel); on_progress gets each
        Progress notification in order. A failure raises SandboxFailed with
        .phase and retryable True: calling prepare again resumes there."""
        return self._invoke("prepare", {}, PrepareResult.from_json, on_progress=on_progress, **opts)

    def image_check(self, ref: str, *, timeout: Optional[float] = None, **opts: Any) -> ImageCheck:
        """Resolve a registry reference and read its manifest and config
        for linux/amd64 without pulling a layer (timeout: the check's, in
        seconds, default 10 on the server). A reference the registry
        lacks, an unreachable registry, a media type or platform capsule
        does not take raise ToolRefused; its .data["reason"] says which
        (docs/serve.md, "image_check")."""
        return self._invoke("image_check", _put({"ref": ref}, timeout=timeout), ImageCheck.from_json, **opts)

    @staticmethod
    def _who(identity: Optional[IdentityLike], sandbox: Optional[str]) -> Dict[str, Any]:
        if (identity is None) == (sandbox is None):
            raise TypeError("give exactly one of identity and sandbox")
        return {"identity": identity_json(identity)} if identity is not None else {"sandbox": sandbox}


def result_of(response: Dict[str, Any]) -> Any:
    """The result of a response, or its error raised."""
    from .errors import ConnectionLost, error_from
    if "__lost__" in response:
        raise ConnectionLost(response["__lost__"])
    if "error" in response:
        raise error_from(response["error"])
    return response.get("result")


def id_ok(id: Any) -> bool:
    """Whether id can be one of our requests' ids: a string or an integer
    (not a bool, nor a list or object, which cannot even be looked up)."""
    return isinstance(id, (str, int)) and not isinstance(id, bool)


def progress_of(msg: Dict[str, Any]) -> Optional[Progress]:
    """A `progress` notification as Progress (None for anything else)."""
    if msg.get("method") != "progress" or "id" in msg or not isinstance(msg.get("params"), dict):
        return None
    return Progress.from_json(msg["params"])


__all__: List[str] = ["Methods", "INLINE_MAX", "LINE_MAX", "ProgressCallback", "result_of", "progress_of", "id_ok"]
