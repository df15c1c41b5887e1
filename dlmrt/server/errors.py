"""The server's errors: `APIError` (an HTTP status plus an OpenAI-style error body) and the checks
that raise it before a request reaches the engine (a leaf: protocol.py and limits.py import it)."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error answered with `status` and {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        *,
        err_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.err_type = err_type or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers
        self.counted = False  # set once its status has been counted in the metrics

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.err_type, self.param, self.code)


def error_body(
    message: str, err_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def check_prompt_chars(chars: int, limit: int | None) -> None:
    """400 before tokenizing when a prompt of `chars` characters cannot fit the context."""
    if limit is not None and chars > limit:
        raise APIError(
            400,
            f"prompt: {chars} characters cannot fit the model's context (at most {limit} "
            "characters: context length x the longest token)",
            "prompt",
            "context_length_exceeded",
        )
