"""Identity, and the results of the serve methods as dataclasses with the
fields docs/serve.md documents. Every result keeps the server's whole
answer in `.raw` (and `result["key"]` / `result.get("key")` read it), so
fields a newer server adds are reachable before this client names them."""

import base64
import builtins
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple, Union


@dataclass(frozen=True)
class Identity:
    """Who a tool call is for: the trusted caller's agent and peer (each 1
    to 64 of A-Z a-z 0-9 . _ @ + = : -, not starting with '.')."""
    agent: str
    peer: str

    def to_json(self) -> Dict[str, str]:
        return {"agent": self.agent, "peer": self.peer}


IdentityLike = Union[Identity, Tuple[str, str], Dict[str, str]]


def identity_json(who: IdentityLike) -> Dict[str, str]:
    """The wire form of an Identity, an (agent, peer) tuple or a dict."""
    if isinstance(who, Identity):
        return who.to_json()
    if isinstance(who, dict) and set(who) == {"agent", "peer"}:
        return {"agent": who["agent"], "peer": who["peer"]}
    if isinstance(who, (tuple, list)) and len(who) == 2:
        return {"agent": who[0], "peer": who[1]}
    raise TypeError(f"identity must be an Identity, an (agent, peer) tuple or "
                    f"{{'agent': ..., 'peer': ...}}, not {who!r}")


class _Result:
    """Base of the results: fields from the answer, the answer in .raw."""
    # Wire names that are Python keywords or clash: field name -> key
    # (a mapping applies only to a class that has the field).
    _KEYS: Dict[str, str] = {"import_": "import"}

    @classmethod
    def from_json(cls, raw: Any):
        raw = raw if isinstance(raw, dict) else {}
        kw = {}
        for f in fields(cls):
            if f.name == "raw":
                continue
            key = cls._KEYS.get(f.name, f.name)
            if key in raw:
                kw[f.name] = cls._convert(f.name, raw[key])
        return cls(raw=raw, **kw)

    @classmethod
    def _convert(cls, name: str, value: Any) -> Any:
        # A directory's entries, in read_file's and list_directory's answers.
        return _entries(value) if name == "entries" else value

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.raw


def _raw() -> Any:
    return field(default_factory=dict, repr=False, compare=False)


@dataclass
class ExecResult(_Result):
    """`exec`: exit_code is None when a signal killed the command."""
    sandbox: Optional[str] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False
    truncated: bool = False
    stdout: str = ""
    stderr: str = ""
    duration_ms: Optional[int] = None
    durable: Optional[bool] = None               # its writes are on the host's disk (None: not said)
    sync_ms: Optional[int] = None                # how long making them so took
    note: Optional[str] = None
    import_: Optional[Dict[str, Any]] = None     # the private import's outcome ("import")
    prepared: Optional[List[str]] = None         # phases this call had to build first
    size: Optional[Dict[str, Any]] = None        # given a size: what it came to (as SizeResult.size)
    raw: Dict[str, Any] = _raw()

    @property
    def ok(self) -> bool:
        """The command exited 0."""
        return self.exit_code == 0 and not self.timed_out


@dataclass
class DirEntry(_Result):
    name: str = ""
    type: str = ""
    size: Optional[int] = None
    raw: Dict[str, Any] = _raw()


def _entries(value: Any) -> List[DirEntry]:
    return [DirEntry.from_json(e) for e in value] if isinstance(value, list) else []


@dataclass
class FileResult(_Result):
    """`read_file`: kind "file" with content, or "directory" with entries."""
    sandbox: Optional[str] = None
    kind: str = ""
    content: Optional[str] = None
    entries: List[DirEntry] = field(default_factory=list)
    truncated: bool = False
    import_: Optional[Dict[str, Any]] = None
    prepared: Optional[List[str]] = None
    raw: Dict[str, Any] = _raw()


@dataclass
class DirectoryListing(_Result):
    """`list_directory`: at most 500 entries; truncated says more exist."""
    sandbox: Optional[str] = None
    kind: str = "directory"
    entries: List[DirEntry] = field(default_factory=list)
    truncated: bool = False
    import_: Optional[Dict[str, Any]] = None
    prepared: Optional[List[str]] = None
    raw: Dict[str, Any] = _raw()


@dataclass
class WriteResult(_Result):
    """`write_file`."""
    sandbox: Optional[str] = None
    path: Optional[str] = None
    bytes: int = 0
    durable: Optional[bool] = None
    sync_ms: Optional[int] = None
    import_: Optional[Dict[str, Any]] = None
    prepared: Optional[List[str]] = None
    raw: Dict[str, Any] = _raw()


@dataclass
class TransferResult(_Result):
    """`upload` and `download`. A download without `to` has the file's bytes
    in `content` (decoded from content_base64); with `to`, `to` is where
    the file or tree was written (resolved)."""
    sandbox: Optional[str] = None
    path: Optional[str] = None
    to: Optional[str] = None
    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0
    durable: Optional[bool] = None               # upload: what was copied is on the host's disk
    sync_ms: Optional[int] = None
    content: Optional[builtins.bytes] = field(default=None, repr=False)
    import_: Optional[Dict[str, Any]] = None
    prepared: Optional[List[str]] = None
    raw: Dict[str, Any] = _raw()
    _KEYS = {"import_": "import", "content": "content_base64"}

    @classmethod
    def _convert(cls, name, value):
        if name == "content" and isinstance(value, str):
            return base64.b64decode(value, validate=True)
        return value


@dataclass
class DiffResult(_Result):
    """`diff`: changes as `capsule diff --json` prints them (dicts with path,
    change, type, mode, old_mode, size, sha256, ...; docs/workspace.md)."""
    sandbox: Optional[str] = None
    changes: List[Dict[str, Any]] = field(default_factory=list)
    raw: Dict[str, Any] = _raw()


@dataclass
class MergeResult(_Result):
    """`merge` (or what it would do, with dry_run): counts of each kind."""
    sandbox: Optional[str] = None
    into: Optional[str] = None
    dry_run: bool = False
    written: int = 0            # how many files were (or would be) written
    removed: int = 0
    created: int = 0            # directories
    chmod: int = 0
    links: int = 0
    git_left_out: int = 0       # changes inside a .git directory, never merged
    raw: Dict[str, Any] = _raw()


@dataclass
class Status(_Result):
    """`status` of an identity, and each entry of `list`. state: none,
    stopped, starting, running, paused, stopping."""
    agent: Optional[str] = None
    peer: Optional[str] = None
    state: str = "none"
    sandbox: Optional[str] = None
    active: int = 0
    queued: int = 0
    idle_ms: Optional[int] = None
    imported: Optional[int] = None
    # status: the sizes its next start gets (cpus, memory_mib, root_mib,
    # work_mib), its own "override", the "running" VM's, "pending".
    size: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = _raw()

    @property
    def identity(self) -> Optional[Identity]:
        return Identity(self.agent, self.peer) if self.agent is not None and self.peer is not None else None


@dataclass
class SizeResult(_Result):
    """`set_size`: size holds cpus, memory_mib, root_mib and work_mib (what
    the next start gets), "override" (the identity's own), "running" (the
    VM's now, or None), "pending" (they differ until its next start) and,
    then, a "note" saying so."""
    agent: Optional[str] = None
    peer: Optional[str] = None
    size: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = _raw()


@dataclass
class SandboxList(_Result):
    """`list`: every identity's sandbox, stopped ones included."""
    sandboxes: List[Status] = field(default_factory=list)
    capacity: Optional[int] = None
    warm_pool: Optional[Dict[str, int]] = None
    raw: Dict[str, Any] = _raw()

    @classmethod
    def _convert(cls, name, value):
        if name == "sandboxes" and isinstance(value, list):
            return [Status.from_json(s) for s in value]
        return value


@dataclass
class ServerInfo(_Result):
    """`info`: the controller's settings."""
    pid: Optional[int] = None
    frontend: Optional[str] = None
    home: Optional[str] = None
    image: Optional[str] = None
    source: Optional[str] = None
    workspace: Optional[str] = None
    private_import: Optional[str] = None
    transfer_dirs: List[str] = field(default_factory=list)
    inline_max: Optional[int] = None
    network: List[str] = field(default_factory=list)
    capacity: Optional[int] = None
    idle_pause_ms: Optional[int] = None
    idle_stop_ms: Optional[int] = None
    warm_pool: Optional[int] = None
    manual_clock: bool = False
    raw: Dict[str, Any] = _raw()


@dataclass
class LifecycleResult(_Result):
    """`stop` and `remove`: state is stopped, removed or none."""
    state: Optional[str] = None
    sandbox: Optional[str] = None
    raw: Dict[str, Any] = _raw()


@dataclass
class SnapshotResult(_Result):
    """`snapshot`: the identity's sandbox and the snapshot taken of it."""
    sandbox: Optional[str] = None
    snapshot: Optional[str] = None
    raw: Dict[str, Any] = _raw()


@dataclass
class ForkResult(_Result):
    """`fork`: the snapshot taken and the children, each an Identity the
    caller addresses from now on, with its sandbox's name."""
    sandbox: Optional[str] = None
    snapshot: Optional[str] = None
    children: List["ForkChild"] = field(default_factory=list)
    raw: Dict[str, Any] = _raw()

    @classmethod
    def _convert(cls, name: str, value: Any) -> Any:
        if name != "children":
            return value
        return [ForkChild(Identity(c["identity"]["agent"], c["identity"]["peer"]), c.get("sandbox"))
                for c in value or []]


@dataclass(frozen=True)
class ForkChild:
    identity: Identity
    sandbox: Optional[str] = None


@dataclass
class Progress(_Result):
    """One `progress` notification: request is the id of the call it belongs
    to; phase kernel | initramfs | image | template; status building |
    line | ready | failed; done phases ready of total (4)."""
    request: Any = None
    phase: Optional[str] = None
    status: Optional[str] = None
    done: int = 0
    total: int = 0
    message: Optional[str] = None
    raw: Dict[str, Any] = _raw()


@dataclass
class ImageCheck(_Result):
    """`image_check`: what the registry says of a reference (docs/images.md,
    "Checking a reference"). platform_digest is the manifest for the
    platform (through an index when index is True: registry_digest is
    then the index's); config holds os, architecture, entrypoint, cmd,
    env; compressed_bytes is the layers' total."""
    reference: Optional[str] = None
    registry_digest: Optional[str] = None
    media_type: Optional[str] = None
    index: bool = False
    platforms: List[str] = field(default_factory=list)
    platform: Optional[str] = None
    platform_digest: Optional[str] = None
    manifest_media_type: Optional[str] = None
    config: Optional[Dict[str, Any]] = None
    layer_count: int = 0
    compressed_bytes: int = 0
    layers: List[Dict[str, Any]] = field(default_factory=list)
    raw: Dict[str, Any] = _raw()


@dataclass
class PrepareResult(_Result):
    """`prepare`: built lists the phases this call built (empty when all
    were there); template is False when templates are off."""
    prepared: bool = False
    built: List[str] = field(default_factory=list)
    kernel: Optional[str] = None
    initramfs: Optional[str] = None
    image: Optional[Dict[str, Any]] = None
    template: Optional[bool] = None
    duration_ms: Optional[int] = None
    raw: Dict[str, Any] = _raw()
