"""ReachRequest.mode is gone: nothing read it and no wire carried it (a broadcast copy is told by its pin and id)."""

from __future__ import annotations

import pytest

from reach_plugins.errors import RequestError
from reach_plugins.model import ReachRequest
from reach_plugins.wire.body import parse_body


def test_requests_have_no_mode_and_the_wire_refuses_one() -> None:
    """The field is not in the model, and a gateway or node body naming it is refused, not silently dropped."""
    assert "mode" not in ReachRequest.model_fields
    assert parse_body({"capability": "query_order"}).capability == "query_order"
    with pytest.raises(RequestError, match="mode"):
        parse_body({"capability": "query_order", "mode": "broadcast"})
