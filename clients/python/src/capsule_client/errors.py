"""Exceptions: one class per JSON-RPC error code of `capsule serve`
(docs/serve.md, "Errors"), all under CapsuleError."""

from typing import Any, Dict, Optional, Type


class CapsuleError(Exception):
    """An error answer of the server, or a failure to reach it.

    code: the JSON-RPC error code (None for ConnectionLost),
    message: the server's message, data: its `data` member (a dict, or
    None), retryable: whether the same call may succeed when sent again
    (`data.retryable`, and always for -32001 Busy)."""

    code: Optional[int] = None

    def __init__(self, code: Optional[int], message: str, data: Any = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    @property
    def retryable(self) -> bool:
        if self.code == Busy.code:
            return True
        return isinstance(self.data, dict) and self.data.get("retryable") is True

    def __str__(self) -> str:
        if self.code is None:
            return self.message
        return f"{self.message} (JSON-RPC error {self.code})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, data={self.data!r})"


class ParseError(CapsuleError):
    """-32700: the server could not read a line as JSON."""
    code = -32700


class InvalidRequest(CapsuleError):
    """-32600: not a JSON-RPC 2.0 request, or a line over 24 MiB."""
    code = -32600


class MethodNotFound(CapsuleError):
    """-32601: the server has no such method (an older server)."""
    code = -32601


class InvalidParams(CapsuleError):
    """-32602: bad params; `data.refused` / `data.transfer_dirs` for a
    transfer path outside the transfer directories."""
    code = -32602


class SandboxFailed(CapsuleError):
    """-32000: the sandbox failed (could not start, died), or a prepare
    phase failed (`data.phase`); `retryable` says whether to retry."""
    code = -32000

    @property
    def phase(self) -> Optional[str]:
        return self.data.get("phase") if isinstance(self.data, dict) else None


class Busy(CapsuleError):
    """-32001: every sandbox slot is busy with running calls; retry later."""
    code = -32001


class ToolRefused(CapsuleError):
    """-32002: the tool refused (file too big, not text, a transfer's paths,
    a merge's conflicts, nothing to diff...)."""
    code = -32002

    @property
    def conflicts(self) -> list:
        """A merge's conflicts: [{"path", "why"}...] (empty otherwise)."""
        return list(self.data.get("conflicts") or []) if isinstance(self.data, dict) else []

    @property
    def refused(self) -> list:
        """The paths a transfer refused (empty otherwise)."""
        return list(self.data.get("refused") or []) if isinstance(self.data, dict) else []


class Cancelled(CapsuleError):
    """-32800: the request was cancelled (by `cancel`, a cancel token, a
    cancelled asyncio task or a call timeout)."""
    code = -32800


class CallTimeout(Cancelled):
    """The call did not answer within its call_timeout: the client sent
    `cancel` for it. code is -32800 when the server confirmed the
    cancellation, None when it did not answer that either."""


class ConnectionLost(CapsuleError):
    """The connection to the server closed or failed before the answer
    came. Whether the call ran is unknown; code is None."""

    def __init__(self, message: str = "the connection to capsule serve was lost"):
        super().__init__(None, message, None)


_BY_CODE: Dict[int, Type[CapsuleError]] = {
    c.code: c for c in (ParseError, InvalidRequest, MethodNotFound, InvalidParams,
                        SandboxFailed, Busy, ToolRefused, Cancelled)
}


def error_from(err: Any) -> CapsuleError:
    """The exception for a JSON-RPC `error` member."""
    if not isinstance(err, dict):
        return CapsuleError(None, f"malformed error answer: {err!r}")
    code = err.get("code")
    cls = _BY_CODE.get(code, CapsuleError) if isinstance(code, int) else CapsuleError
    return cls(code if isinstance(code, int) else None, str(err.get("message", "")), err.get("data"))
