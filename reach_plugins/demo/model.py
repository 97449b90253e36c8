"""A deterministic, scripted tool-calling chat model, so the demo needs no API key.

It reads the latest customer message, calls the tool its script names for it,
and once the tool answered, words the answer from the tool's result. A real
OpenAI-compatible model replaces it when ``REACH_DEMO_OPENAI_MODEL`` and
``OPENAI_API_KEY`` are set and ``langchain-openai`` is installed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable


@dataclass(frozen=True, slots=True)
class Rule:
    """When the customer's message matches ``pattern``, call ``tool`` with ``args(match)``."""

    pattern: str
    tool: str
    args: Callable[[re.Match[str]], dict[str, Any]]


class ScriptedChatModel(BaseChatModel):
    """Calls tools by script; answers from their results. Deterministic."""

    rules: list[Rule]

    @property
    def _llm_type(self) -> str:
        return "reach-demo-scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(**kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            message = AIMessage(content=_answer(last))
        elif isinstance(last, HumanMessage):
            message = self._call_for(str(last.content), len(messages))
        else:
            message = AIMessage(content="Is there anything else I can help with?")
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _call_for(self, text: str, turn: int) -> AIMessage:
        for rule in self.rules:
            match = re.search(rule.pattern, text, re.IGNORECASE)
            if match:
                call = {"name": rule.tool, "args": rule.args(match), "id": f"call_{turn}_{rule.tool}"}
                return AIMessage(content="", tool_calls=[call])
        return AIMessage(content="I can help with orders, stock, tickets and our policies.")


def _answer(result: ToolMessage) -> str:
    if result.status == "error":
        return f"Sorry, I could not get that done: {result.content}"
    try:
        data = json.loads(str(result.content))
    except ValueError:
        return str(result.content)
    if isinstance(data, dict) and "status" in data and "order_id" in data:
        return f"Order {data['order_id']} is {data['status']} ({', '.join(data.get('items', []))}), due {data['eta']}."
    if isinstance(data, dict) and "on_hand" in data:
        return f"We have {data['on_hand']} x {data['name']} in stock."
    if isinstance(data, dict) and "ticket" in data:
        return f"I opened ticket {data['ticket']} for work order {data['wo_number']}."
    if isinstance(data, dict) and "answers" in data:
        return " ".join(data["answers"])
    return json.dumps(data, ensure_ascii=False)


def demo_model(rules: list[Rule]) -> BaseChatModel:
    """The scripted model, or a real OpenAI-compatible one when its environment variables are set."""
    name = os.environ.get("REACH_DEMO_OPENAI_MODEL")
    if name and os.environ.get("OPENAI_API_KEY"):
        try:
            from langchain_openai import ChatOpenAI
        except ImportError:
            pass
        else:
            model: BaseChatModel = ChatOpenAI(model=name, temperature=0)
            return model
    return ScriptedChatModel(rules=rules)
