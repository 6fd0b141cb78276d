"""The HTTP application: `create_app(engine, options)` (docs/server.md).

Starlette on uvicorn. Handlers parse and render on a thread-pool thread, then hand a job to the
one engine worker (worker.py) and turn its events into each API's JSON or SSE shapes
(formats.py). The engine is reached only through the Engine/Session surface, so a scripted
engine (scripted.py) drives exactly the same code in tests.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..protocol import TemplateError, encode_guarded, render
from . import formats
from . import requests as rq
from .requests import ApiError, Defaults, Spec
from .worker import Job, JobEvent, QueueFull, Worker

log = logging.getLogger("ds4agent.server")
MODEL_ID = "deepseek-v4-flash"


@dataclass
class ServerOptions:
    defaults: Defaults = field(default_factory=Defaults)
    api_key: str | None = None
    cors: str | None = None
    max_body: int = 64 << 20
    max_queue: int = 16
    keepalive_s: float = 5.0
    min_save_tokens: int = 512
    store: Any = None  # a SessionStore for the on-disk cache, or None
    parallel: int = 1  # slots: requests generating at once, each with its own session


# No API request nests deeper than this (a tool's JSON schema in a message, a few levels each);
# a body nested deeper is refused before anything walks it recursively.
MAX_DEPTH = 64


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests lists and objects more than ``limit`` deep; walks
    it without recursion."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > limit:
                return True
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
    return False


def text_bytes(value: Any) -> int:
    """UTF-8 bytes of every string in ``value`` (parsed JSON), without recursion: at least the
    text a prompt made of it renders."""
    n, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            n += len(v.encode("utf-8", "surrogatepass"))
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return n


def _dumps(d: Any) -> str:
    return json.dumps(d, ensure_ascii=False, separators=(",", ":"))


def _anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_response(path: str, e: ApiError) -> Response:
    if _anthropic_path(path):
        kind = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error", 500: "api_error"}.get(e.status, e.kind)
        body: dict = {"type": "error", "error": {"type": kind, "message": e.message, **e.extra}}
    else:
        kind = {401: "authentication_error", 404: "not_found_error", 503: "server_error",
                500: "server_error"}.get(e.status, e.kind)
        body = {"error": {"message": e.message, "type": kind, "param": e.param, "code": e.code, **e.extra}}
    return Response(_dumps(body), e.status, headers=e.headers, media_type="application/json")


class Server:
    def __init__(self, engine: Any, options: ServerOptions) -> None:
        self.engine = engine
        self.opt = options
        self.tok = engine.tokenizer
        self.ctx = engine.session().ctx if not hasattr(engine, "ctx") else engine.ctx
        options.defaults.ctx = self.ctx
        self.longest_token = max(len(self.tok.token_bytes(t)) for t in range(self.tok.vocab_size))
        self.worker = Worker(engine, options.store, options.max_queue, options.min_save_tokens,
                             parallel=options.parallel)
        if options.defaults.system:  # --prefix-file: its KV in the disk cache, once
            prefix = render([{"role": "system", "content": options.defaults.system}])
            self.worker.prime(self.tok.encode_rendered(prefix))
        self.counter = 0

    # -- request plumbing ---------------------------------------------------------------------
    async def check_key(self, request: Request) -> None:
        """--api-key: the key as a bearer token (OpenAI clients) or x-api-key (Anthropic)."""
        if self.opt.api_key is not None:
            given = request.headers.get("x-api-key") or ""
            auth = request.headers.get("authorization") or ""
            if auth.lower().startswith("bearer "):
                given = given or auth[7:].strip()
            if not hmac.compare_digest(given.encode(), self.opt.api_key.encode()):
                raise ApiError(401, "invalid or missing API key", "authentication_error")

    async def body(self, request: Request) -> dict:
        await self.check_key(request)
        cl = request.headers.get("content-length")
        if cl is not None and cl.isdigit() and int(cl) > self.opt.max_body:
            raise ApiError(413, f"request body over {self.opt.max_body} bytes", "invalid_request_error")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > self.opt.max_body:
                raise ApiError(413, f"request body over {self.opt.max_body} bytes", "invalid_request_error")
        try:
            body = json.loads(bytes(data))
        except (ValueError, UnicodeDecodeError):
            raise ApiError(400, "invalid JSON request") from None
        except RecursionError:  # nested deeper than the decoder goes
            raise ApiError(400, f"JSON request nested more than {MAX_DEPTH} levels deep") from None
        if too_deep(body, MAX_DEPTH):
            raise ApiError(400, f"JSON request nested more than {MAX_DEPTH} levels deep")
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    def prepare(self, spec: Spec) -> tuple[list[int], bytes, dict | None]:
        """Render and tokenise (thread pool). Assistant tool calls the server sampled get
        their exact DSML back from the tool memory (docs/server.md §3)."""
        replay = None
        param = {"chat": "messages", "messages": "messages", "responses": "input", "completions": "prompt"}[spec.api]
        # No token is longer than the tokenizer's longest: text of more bytes than the context
        # times that cannot fit, and is refused before tokenising it (seconds of CPU and
        # hundreds of MB for a prompt of many megabytes).
        least = text_bytes(spec.prompt if spec.messages is None else spec.messages) // self.longest_token
        if least >= self.ctx:
            raise ApiError(400, f"Prompt has at least {least} tokens, but the configured context size is {self.ctx} "
                           "tokens", param=param, code="context_length_exceeded",
                           extra={"n_prompt_tokens": least, "n_ctx": self.ctx})
        if spec.messages is None:
            ids = self.tok.encode_rendered(spec.prompt or "")
        else:
            with self.worker.memory_lock:  # the slots' threads add to it
                msgs, replay = self.worker.memory.replay(spec.messages, spec.mode == "thinking")
            try:
                _, ids = encode_guarded(self.tok, msgs, lambda m: render(m, spec.mode, spec.effort))
            except TemplateError as e:
                raise ApiError(400, str(e), param="messages") from None
        if len(ids) >= self.ctx:
            raise ApiError(400, f"Prompt has {len(ids)} tokens, but the configured context size is {self.ctx} tokens",
                           param=param, code="context_length_exceeded",
                           extra={"n_prompt_tokens": len(ids), "n_ctx": self.ctx})
        return ids, self.tok.decode_bytes(ids), replay

    async def run(self, request: Request, spec: Spec, fmt_cls: type) -> Response:
        ids, text, replay = await run_in_threadpool(self.prepare, spec)
        self.counter += 1
        fmt = fmt_cls(spec, self.counter, len(ids))
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[JobEvent] = asyncio.Queue()

        def emit(ev: JobEvent) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, ev)

        mode = spec.mode if spec.messages is not None else "raw"
        job = Job(spec.api, ids, text, mode, spec.sampling, spec.max_tokens, emit, spec.stop,
                  "toolu_" if spec.api == "messages" else "call_", replay=replay,
                  steering=self.worker.steering_for(spec.steering))
        try:
            self.worker.submit(job)
        except QueueFull as e:
            raise ApiError(503, f"server busy: {e}", "server_error", headers={"Retry-After": "2"}) from None
        if spec.stream:
            return StreamingResponse(self._stream(request, job, queue, fmt), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            while True:
                get = asyncio.ensure_future(queue.get())
                gone = asyncio.ensure_future(_disconnected(request))
                finished, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                if get not in finished:
                    get.cancel()
                    job.cancel.set()
                    return Response(status_code=499)
                gone.cancel()
                ev = get.result()
                if ev.kind == "error":
                    d = ev.data or {}
                    raise ApiError(d.get("status", 500), ev.text, "server_error" if d.get("status", 500) >= 500
                                   else "invalid_request_error", code=d.get("code"),
                                   extra={k: v for k, v in d.items() if k in ("n_prompt_tokens", "n_ctx")})
                fmt.event(ev)
                if ev.kind == "done":
                    return Response(_dumps(fmt.final()), media_type="application/json")
        finally:
            job.cancel.set()  # whatever ended this wait (an error, a bug), the job is not wanted

    async def _stream(self, request: Request, job: Job, queue: asyncio.Queue, fmt: Any) -> AsyncIterator[str]:
        done = False
        try:
            for piece in fmt.head():
                yield piece
            while True:
                try:
                    ev = await asyncio.wait_for(queue.get(), self.opt.keepalive_s)
                except asyncio.TimeoutError:
                    yield ": keep-alive\n\n"  # long queue waits and prefills: proxies keep the stream
                    continue
                if ev.kind == "error":
                    done = True
                    yield fmt.error(ev.text)
                    return
                for piece in fmt.event(ev):
                    yield piece
                if ev.kind == "done":
                    done = True
                    for piece in fmt.tail():
                        yield piece
                    return
        finally:
            if not done:
                job.cancel.set()  # the client left: generation stops at the next token


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(engine: Any, options: ServerOptions | None = None) -> Starlette:
    """The server's ASGI app for an opened engine (or a scripted one). ``app.state.server``
    holds the worker; ``app.state.server.worker.close()`` saves and stops it."""
    opt = options or ServerOptions()
    server = Server(engine, opt)

    def endpoint(parse: Callable[[dict, Defaults], Spec], fmt_cls: type) -> Callable:
        async def handler(request: Request) -> Response:
            t0 = time.perf_counter()
            try:
                body = await server.body(request)
                spec = parse(body, opt.defaults)
                return await server.run(request, spec, fmt_cls)
            except ApiError as e:
                log.info("%s %s -> %d %s (%.2fs)", request.method, request.url.path, e.status, e.message,
                         time.perf_counter() - t0)
                return error_response(request.url.path, e)
        return handler

    async def count_tokens(request: Request) -> Response:
        try:
            body = await server.body(request)
            spec = rq.count_tokens_messages(body, opt.defaults)
            ids, _, _ = await run_in_threadpool(server.prepare, spec)
            return JSONResponse({"input_tokens": len(ids)})
        except ApiError as e:
            return error_response(request.url.path, e)

    def model_object() -> dict:
        return {"id": MODEL_ID, "object": "model", "created": 1767225600, "owned_by": "ds4agent",
                "name": "DeepSeek V4 Flash", "context_length": server.ctx,
                "max_completion_tokens": min(opt.defaults.max_tokens, server.ctx)}

    async def models(request: Request) -> Response:
        try:
            await server.check_key(request)
        except ApiError as e:
            return error_response(request.url.path, e)
        return JSONResponse({"object": "list", "data": [model_object()]})

    async def model(request: Request) -> Response:
        try:
            await server.check_key(request)
        except ApiError as e:
            return error_response(request.url.path, e)
        if request.path_params["name"] != MODEL_ID:
            return error_response(request.url.path, ApiError(404, f"model {request.path_params['name']!r} not found",
                                                             "not_found_error", code="model_not_found"))
        return JSONResponse(model_object())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": MODEL_ID, "queued": server.worker.waiting})

    async def fallback(request: Request) -> Response:
        if request.method == "OPTIONS":  # CORS preflights and probes
            return Response(status_code=204)
        return error_response(request.url.path, ApiError(404, "unknown endpoint", "not_found_error"))

    async def not_found(request: Request, exc: HTTPException) -> Response:
        status = exc.status_code
        msg = "unknown endpoint" if status == 404 else "method not allowed" if status == 405 else str(exc.detail)
        return error_response(request.url.path, ApiError(status, msg, "not_found_error" if status == 404
                                                         else "invalid_request_error"))

    async def crashed(request: Request, exc: Exception) -> Response:
        log.exception("request failed")
        return error_response(request.url.path, ApiError(500, f"internal error: {exc}", "server_error"))

    routes = [
        Route("/health", health, methods=["GET"]), Route("/v1/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]), Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/v1/chat/completions", endpoint(rq.chat, formats.ChatFormat), methods=["POST"]),
        Route("/v1/completions", endpoint(rq.completions, formats.CompletionFormat), methods=["POST"]),
        Route("/v1/responses", endpoint(rq.responses, formats.ResponsesFormat), methods=["POST"]),
        Route("/v1/messages", endpoint(rq.messages, formats.MessagesFormat), methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/{any:path}", fallback, methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
    ]
    middleware = []
    if opt.cors:
        middleware.append(Middleware(CORSMiddleware, allow_origins=[opt.cors] if opt.cors != "*" else ["*"],
                                     allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"]))
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={HTTPException: not_found, Exception: crashed})
    app.state.server = server
    return app
