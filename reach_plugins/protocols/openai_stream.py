"""The ``openai-compatible`` stream: content deltas as they come, tool calls assembled, usage and refusals kept.

Tool-call arguments arrive as string fragments spread over chunks (``'{"id": "'``,
``'12'``, ``'"}'``): a fragment is not JSON of its own, so calls are assembled
per ``index`` and emitted whole, with the chunk that carries the
``finish_reason`` (raw fragments too when asked). The usage chunk
(``choices: []``, asked for with ``stream_options.include_usage``) is a data
event with ``usage``. Refusal fragments are joined and end the stream with a
``refusal`` error, as a blocking call does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from reach_plugins.model import ErrorInfo
from reach_plugins.protocols.base import EndsOnce, error_info, invalid, list_at, mapping_at
from reach_plugins.protocols.openai_wire import first_choice, meta_of, parsed_arguments, text_of
from reach_plugins.transport import Call, Reply, StreamEvent
from reach_plugins.wire.sse import SseEvent


def refusal_error(refusal: str) -> ErrorInfo:
    return ErrorInfo(type="refusal", message=f"the model refused: {refusal}")


def refused(call: Call, refusal: str, meta: dict[str, Any]) -> Reply:
    """A refusal: a ``fail`` of type ``refusal`` whose data keeps the text (the core treats it as business)."""
    data = {"reply_content": "", "refusal": refusal, "tool_calls": [], "raw_meta": meta}
    return Reply(
        status="fail",
        data=data,
        error=refusal_error(refusal),
        agent=call.agent.name,
        instance=call.instance.instance_id,
    )


class OpenAIStreamDecoder(EndsOnce):
    """``data: {chunk}`` frames into ``reply_content`` deltas, whole ``tool_calls`` and ``usage``; ``[DONE]`` ends."""

    def __init__(self, call: Call, *, fragments: bool = False) -> None:
        super().__init__(call)
        self._fragments = fragments
        self._finished = False
        self._calls: dict[int, dict[str, Any]] = {}
        self._refusal: list[str] = []

    def feed(self, event: SseEvent) -> list[StreamEvent]:
        if self._done:
            return []
        if event.data.strip() == "[DONE]":
            return self._complete()
        try:
            chunk = json.loads(event.data)
        except ValueError:
            raise invalid(self._call, f"a stream chunk is not JSON ({event.data[:80]!r})") from None
        if not isinstance(chunk, Mapping):
            raise invalid(self._call, f"a stream chunk is not a JSON object ({event.data[:80]!r})")
        if "error" in chunk:
            failed = error_info(chunk["error"], "transient", "the agent's stream failed")
            return self._finish(StreamEvent("error", error=failed))
        events = self._choice(chunk, first_choice(chunk))
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            data = {"reply_content": "", "tool_calls": [], "usage": dict(usage), "raw_meta": meta_of(chunk, None)}
            events.append(StreamEvent("data", data))
        return events

    def _choice(self, chunk: Mapping[str, Any], choice: Mapping[str, Any] | None) -> list[StreamEvent]:
        if choice is None:
            return []
        delta = mapping_at(choice, "delta")
        content = text_of(delta.get("content"))
        refusal = delta.get("refusal")
        if isinstance(refusal, str):
            self._refusal.append(refusal)
        raw_calls = list_at(delta, "tool_calls")
        self._merge(raw_calls)
        finish = choice.get("finish_reason")
        self._finished = self._finished or bool(finish)
        data: dict[str, Any] = {"reply_content": content or "", "tool_calls": [], "raw_meta": meta_of(chunk, choice)}
        if finish:
            data["tool_calls"] = self._assembled()
        if self._fragments and raw_calls:
            data["tool_call_fragments"] = raw_calls
        if not (content or finish or "tool_call_fragments" in data):
            return []
        return [StreamEvent("data", data)]

    def _merge(self, fragments: list[Any]) -> None:
        """Add each fragment to its call (by ``index``): the first id and name win, arguments concatenate."""
        for fragment in fragments:
            if not isinstance(fragment, Mapping):
                continue
            index = fragment.get("index", len(self._calls))
            known = self._calls.setdefault(index, {"id": None, "name": None, "arguments": "", "index": index})
            function = mapping_at(fragment, "function")
            known["id"] = known["id"] or fragment.get("id")
            known["name"] = known["name"] or function.get("name")
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                known["arguments"] += arguments

    def _assembled(self) -> list[dict[str, Any]]:
        calls = [{**call, "arguments": parsed_arguments(call["arguments"])} for _, call in sorted(self._calls.items())]
        self._calls.clear()
        return calls

    def _complete(self) -> list[StreamEvent]:
        """The stream is over: calls never closed by a finish_reason, then the end (or the refusal)."""
        events = []
        if self._calls:
            events.append(StreamEvent("data", {"reply_content": "", "tool_calls": self._assembled(), "raw_meta": {}}))
        if self._refusal:
            return [*events, *self._finish(StreamEvent("error", error=refusal_error("".join(self._refusal))))]
        return [*events, *self._finish(StreamEvent("end"))]

    def close(self) -> list[StreamEvent]:
        """A stream whose last chunk had a ``finish_reason`` is complete even without ``[DONE]``."""
        if self._finished and not self._done:
            return self._complete()
        return super().close()

    def _cut(self) -> str:
        return f"the stream from instance {self._call.instance.instance_id} ended before [DONE]"
