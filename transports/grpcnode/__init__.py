"""gRPC node transport: reach agents through a Reach node (``reach node``); the protocol is in ``protos/reach.proto``.

``reach_pb2.py``, ``reach_pb2.pyi`` and ``reach_pb2_grpc.py`` are generated
and checked in; regenerate them after editing the proto (README.md here).
Needs the ``grpc`` extra: ``pip install "reach-plugins[grpc]"``.
"""

try:
    import grpc  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError('the gRPC node transport needs the grpc extra: pip install "reach-plugins[grpc]"') from exc

from reach_plugins.wire.headers import META_CALLBACK as CALLBACK
from transports.grpcnode.transport import GrpcNodeTransport

__all__ = ["CALLBACK", "GrpcNodeTransport"]
