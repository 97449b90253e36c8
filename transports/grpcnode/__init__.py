"""gRPC node transport: reach agents through a Reach node (``reach node``).

The protocol is ``reach_plugins/wire/proto/reach.proto``; its generated modules are checked in beside it
(regenerate them after editing the proto: README.md here).
Needs the ``grpc`` extra: ``pip install "reach-plugins[grpc]"``.
"""

try:
    import grpc  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError('the gRPC node transport needs the grpc extra: pip install "reach-plugins[grpc]"') from exc

from reach_plugins.wire.headers import META_CALLBACK as CALLBACK
from transports.grpcnode.transport import GrpcNodeTransport

__all__ = ["CALLBACK", "GrpcNodeTransport"]
