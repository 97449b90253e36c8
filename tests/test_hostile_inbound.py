"""The bounded reader and the strict JSON parser shared by the gateway and the agent SDK (unit level)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reach_plugins.errors import RequestError
from reach_plugins.server.inbound import (
    SMALL_BODY,
    BodyPlaces,
    BodyTimeout,
    BodyTooLarge,
    InputLimits,
    loads,
    read_body,
    single_headers,
)


async def _chunks(sizes: list[int], gate: asyncio.Event | None = None) -> AsyncIterator[bytes]:
    """The chunks; with ``gate``, every chunk after the first waits for it."""
    for index, size in enumerate(sizes):
        if gate is not None and index:
            await gate.wait()
        yield b" " * size


async def test_large_bodies_are_read_one_at_a_time() -> None:
    """With one large-body place, a second body past 64 KiB waits until the first is read; small ones do not."""
    large = InputLimits(large_bodies=1).places().of("acme")
    gate = asyncio.Event()
    first = asyncio.create_task(read_body(_chunks([SMALL_BODY + 1, 10], gate), {}, large=large))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(read_body(_chunks([SMALL_BODY + 1, 10]), {}, large=large))
    small = await read_body(_chunks([100]), {}, large=large)
    await asyncio.sleep(0.05)
    assert len(small) == 100 and not second.done()
    gate.set()
    assert len(await first) == len(await second) == SMALL_BODY + 11
    assert not large.locked()


async def test_each_tenant_has_large_body_places_of_its_own() -> None:
    """A tenant holding its one place never makes another tenant wait; tenants past the cap share one set."""
    places = BodyPlaces(1, tenants=2)
    gate = asyncio.Event()
    held = asyncio.create_task(read_body(_chunks([SMALL_BODY + 1, 10], gate), {}, large=places.of("acme")))
    await asyncio.sleep(0.01)
    other = await asyncio.wait_for(read_body(_chunks([SMALL_BODY + 1]), {}, large=places.of("globex")), 1.0)
    assert len(other) == SMALL_BODY + 1 and not held.done()
    assert places.of("acme") is not places.of("globex")
    assert places.of("third") is places.of("fourth") is places.of(None)
    gate.set()
    await held


async def test_a_place_is_released_when_the_body_is_refused() -> None:
    """An oversize or stalled body gives its large-body place back."""
    large = InputLimits(large_bodies=1).places().of("acme")
    with pytest.raises(BodyTooLarge):
        await read_body(_chunks([SMALL_BODY] * 40), {}, limit=1 << 20, large=large)
    with pytest.raises(BodyTimeout):
        await read_body(
            _chunks([SMALL_BODY, 1], asyncio.Event()), {"content-length": "70000"}, timeout=0.05, large=large
        )
    assert not large.locked()


@pytest.mark.parametrize("declared", ["1e3", "-1", "\u00b2", "12 ", ""])
async def test_a_content_length_that_is_not_digits_is_refused(declared: str) -> None:
    """Content-Length must be ASCII digits (no exponent, sign, superscript or blank)."""
    with pytest.raises(RequestError, match="Content-Length"):
        await read_body(_chunks([1]), {"content-length": declared})


def test_duplicate_watched_headers_are_refused_and_others_kept() -> None:
    """A second Authorization is an error; repeated ordinary headers keep the last value; -bin values are dropped."""
    with pytest.raises(RequestError, match="authorization appears more than once"):
        single_headers([(b"Authorization", b"a"), (b"authorization", b"b")])
    assert single_headers([(b"Accept", b"a"), (b"accept", b"b"), ("x-trace-bin", b"\x00")]) == {"accept": "b"}


@given(depth=st.integers(min_value=1, max_value=3000))
def test_depth_is_refused_past_the_limit_and_never_a_recursion_error(depth: int) -> None:
    """Any nesting depth gives either the value (<= 64) or a RequestError naming the limit."""
    raw = b"[" * depth + b"]" * depth
    if depth <= 64:
        assert loads(raw) is not None
    else:
        with pytest.raises(RequestError, match="deeper than 64"):
            loads(raw)


@given(
    value=st.recursive(
        st.text() | st.integers() | st.floats(allow_nan=False, allow_infinity=False),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    )
)
def test_loads_accepts_what_json_dumps_writes(value: object) -> None:
    """Strictness refuses nothing that standard JSON can say."""
    import json

    assert loads(json.dumps(value).encode()) == value


def _walked(raw: bytes, max_depth: int) -> object:
    """What ``loads`` answers when it always walks the value (the reference its byte-count shortcut must match)."""
    import json

    from reach_plugins.server.inbound import _check

    value = json.loads(raw)
    _check(value, max_depth, "body")
    return value


@given(
    value=st.recursive(
        st.text(st.characters(categories=["Cs"])) | st.text() | st.integers(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=12,
    ),
    max_depth=st.integers(min_value=0, max_value=6),
    ensure_ascii=st.booleans(),
)
def test_loads_refuses_exactly_what_a_full_walk_refuses(value: object, max_depth: int, ensure_ascii: bool) -> None:
    """Skipping the walk when the brackets cannot nest ``max_depth`` deep and no escape is present changes no
    answer: the same value, or a RequestError, for depths around the limit and strings with lone surrogates."""
    import json

    try:
        raw = json.dumps(value, ensure_ascii=ensure_ascii).encode("utf-8")
    except UnicodeEncodeError:
        raw = json.dumps(value, ensure_ascii=True).encode()  # a lone surrogate only travels escaped
    try:
        expected: object = _walked(raw, max_depth)
    except RequestError:
        with pytest.raises(RequestError):
            loads(raw, max_depth=max_depth)
    else:
        assert loads(raw, max_depth=max_depth) == expected
