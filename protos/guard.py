"""The gate of every ipupod gRPC server: the job token is checked before a request is parsed,
and a request that does not parse is refused in one log line, never a traceback.

grpcio hands a server interceptor the method name and the metadata before it reads the
request, so :class:`TokenInterceptor` refuses a call without the job token (metadata
:data:`~protos.TOKEN_METADATA_KEY`) with ``UNAUTHENTICATED`` without looking at its bytes. For
calls that pass, the method's deserializer is wrapped: a message that does not parse becomes
``INVALID_ARGUMENT`` (logged once, as one line) instead of grpcio's "Exception deserializing
request!" traceback. Importing this module loads grpc.
"""

from __future__ import annotations

import hmac
import logging

import grpc

from protos import TOKEN_METADATA_KEY

logger = logging.getLogger(__name__)


class _Malformed:
    """Stands for a request that did not parse (the handler never sees it)."""

    def __init__(self, error: str):
        self.error = error


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode,
             details: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that aborts at once; it has no
    deserializer, so the request stays raw bytes and is never parsed."""
    def abort(_request, context):
        context.abort(code, details)
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler,
             (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler,
             (True, True): grpc.stream_stream_rpc_method_handler}
    return kinds[(handler.request_streaming, handler.response_streaming)](abort)


def _safe_deserializer(deserialize, method: str):
    def parse(data: bytes):
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the sender's fault
            return _Malformed(f"{type(exc).__name__}: {exc}")
    return parse


def _checked_unary(behaviour, method: str):
    def handle(request, context):
        if isinstance(request, _Malformed):
            logger.warning("refused a malformed %s request from %s: %s", method,
                           context.peer(), request.error)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"malformed request: {request.error}")
        return behaviour(request, context)
    return handle


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses calls without the job ``token`` before their request is read, and malformed
    requests of unary methods in one log line.

    Args:
        token: the job token (non-empty).

    Raises:
        ValueError: ``token`` is empty.
    """

    def __init__(self, token: str):
        if not token:
            raise ValueError("the job token must not be empty")
        self._token = token.encode()

    def __repr__(self) -> str:   # never the token
        return "TokenInterceptor(token=<hidden>)"

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)   # looks the method up; reads nothing
        if handler is None:
            return None
        given = dict(handler_call_details.invocation_metadata or ()).get(TOKEN_METADATA_KEY)
        if given is None:
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                            f"no job token: every call must carry metadata "
                            f"{TOKEN_METADATA_KEY!r}")
        if not hmac.compare_digest(str(given).encode(), self._token):
            return _refusal(handler, grpc.StatusCode.UNAUTHENTICATED,
                            "wrong job token: this server belongs to another job")
        if handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        return grpc.unary_unary_rpc_method_handler(
            _checked_unary(handler.unary_unary, method),
            request_deserializer=_safe_deserializer(handler.request_deserializer, method),
            response_serializer=handler.response_serializer)
