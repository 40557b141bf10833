"""A Python client for `capsule serve`, capsule's JSON-RPC server for
orchestrators (docs/serve.md). Standard library only; Python >= 3.9.

    from capsule_client import Client, Identity
    with Client("/path/to/serve.sock") as c:
        r = c.exec(Identity("agent", "peer"), ["sh", "-c", "echo hi"])
        print(r.exit_code, r.stdout)

AsyncClient is the asyncio variant; raw.Connection the bare wire."""

from .aio import AsyncClient, PrepareStream
from .client import Call, Client
from .errors import (Busy, CallTimeout, CapsuleError, Cancelled, ConnectionLost, InvalidParams,
                     InvalidRequest, MethodNotFound, ParseError, SandboxFailed, ToolRefused, error_from)
from .raw import Connection
from .types import (DiffResult, DirectoryListing, DirEntry, ExecResult, FileResult, ForkChild, ForkResult,
                    Identity, ImageCheck, LifecycleResult, MergeResult, PrepareResult, Progress, SandboxList,
                    ServerInfo, SizeResult, SnapshotResult,
                    Status, TransferResult, WriteResult)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient", "Busy", "Call", "CallTimeout", "CapsuleError", "Cancelled", "Client", "Connection",
    "ConnectionLost", "DiffResult", "DirEntry", "DirectoryListing", "ExecResult", "FileResult", "ForkChild",
    "ForkResult", "Identity", "ImageCheck",
    "InvalidParams", "InvalidRequest", "LifecycleResult", "MergeResult", "MethodNotFound", "ParseError",
    "PrepareResult", "PrepareStream", "Progress", "SandboxFailed", "SandboxList", "ServerInfo", "SizeResult",
    "SnapshotResult", "Status",
    "ToolRefused", "TransferResult", "WriteResult", "error_from",
]
