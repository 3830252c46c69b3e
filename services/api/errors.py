"""The one error type handlers raise: rendered as {"error": message} with its status (and headers)."""

from __future__ import annotations


class ApiError(Exception):
    """Rendered as {"error": message} with the given status by the app's handler."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
