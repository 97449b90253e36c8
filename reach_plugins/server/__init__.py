"""What every server of ours shares: inbound limits, uvicorn hardening, access rules, the forwarder, issuer routes."""
