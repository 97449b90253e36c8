"""What every server of ours shares: the server layer under every route, inbound limits, uvicorn hardening, access
rules, the forwarder and how it is built, issuer routes."""
