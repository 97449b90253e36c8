"""The node's gRPC protocol (``reach.proto``) and the code grpcio-tools generated from it."""
