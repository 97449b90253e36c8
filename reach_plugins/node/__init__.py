"""The Reach node: a grpc.aio server next to agents, with a bounded priority queue and explicit backpressure.

``reach node --config agents.yaml --host 0.0.0.0 --port 50051`` runs one;
:func:`build_node` builds one to start in-process. Clients reach it with
``transports.grpcnode.GrpcNodeTransport``. It shares the gateway's forwarder
(router + core + next hop), access rules and route table.

Node-to-node forwarding: an instance whose endpoint is ``grpc://host:port``
sits behind the Reach node at that address; the node forwards to it with
the tenant's credential for that agent (typically the tenant's token at the
other node), adds its ``node_id`` to ``x-reach-via``, and refuses a request
that already passed through it. The node that forwards owns the retries;
the next one runs each forwarded request once (``x-reach-retry: upstream``).

Needs the ``grpc`` extra: ``pip install "reach-plugins[grpc]"``.
"""

from reach_plugins.node.queue import WorkQueue
from reach_plugins.node.server import NodeServer, build_node, run_node, serve_node
from reach_plugins.node.service import NodeService
from reach_plugins.node.tickets import Tickets

__all__ = ["NodeServer", "NodeService", "Tickets", "WorkQueue", "build_node", "run_node", "serve_node"]
