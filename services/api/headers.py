"""Security headers on every response: nothing the API answers may run a script it did not choose.

A pure ASGI middleware (no per-request task, unlike Starlette's BaseHTTPMiddleware): it adds
`X-Content-Type-Options: nosniff` everywhere, and a Content-Security-Policy that allows nothing to
every response that did not set its own (JSON, errors, Prometheus text): were one of them ever shown
as a page, nothing in it would run. The HTML pages set their own policies (webview.py, apidocs.py).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

NOTHING = b"default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                names = {k.lower() for k, _ in headers}
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", NOTHING))
                if b"x-content-type-options" not in names:
                    headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
