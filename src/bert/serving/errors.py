"""The server's errors: TEI's error kinds and `ApiError`, an HTTP status with TEI's body (OpenAI's on the
OpenAI routes)."""

from __future__ import annotations

from typing import Any

from bert.serving.responses import JSONResponse

# Error kinds, TEI's names.
VALIDATION = "Validation"
OVERLOADED = "Overloaded"
UNHEALTHY = "Unhealthy"
BACKEND = "Backend"
EMPTY = "Empty"


class ApiError(Exception):
    """An HTTP error with TEI's body (OpenAI's, on the OpenAI routes)."""

    def __init__(self, status: int, message: str, error_type: str = VALIDATION, headers: dict[str, str] | None = None):
        # A message may quote the client's field names, whose JSON "\\ud800" escapes are lone surrogates that the
        # UTF-8 body cannot hold: they are spelled out as escapes instead.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.headers = headers

    def response(self, openai: bool = False) -> JSONResponse:
        if openai:
            # OpenAI's clients read error.message; TEI's OpenAICompatErrorResponse is the flat fields.
            fields = {"message": self.message, "type": self.error_type, "code": self.status}
            body: dict[str, Any] = {"error": fields, **fields, "error_type": self.error_type}
        else:
            body = {"error": self.message, "error_type": self.error_type}
        return JSONResponse(body, status_code=self.status, headers=self.headers)
