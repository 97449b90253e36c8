"""The wire: headers, the request and reply bodies every server and transport share, SSE, JSON rules, the proto."""
