"""Shared pytest setup: the real-server fixtures of tests/servers.py, the in-memory spans of tests/span_capture.py.

Agents verify tokens by default. Every process a test starts (agents, gateways, nodes, callers) inherits one signing
key in ``$REACH_ISSUER_KEYS``, so their in-process issuers accept each other's tokens, as a fleet sharing keys does.
"""

import os

from reach_plugins.security.keys import ENV_KEYS, SigningKey

os.environ.setdefault(ENV_KEYS, SigningKey.generate().pem().decode())

pytest_plugins = ["servers", "span_capture"]
