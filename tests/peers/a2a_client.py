"""The official ``a2a-sdk`` 1.x client against an A2A agent, run by the tests in the peers' venv.

    .venv-peers/bin/python tests/peers/a2a_client.py BASE_URL TEXT DATA_JSON [stream|send]

Resolves the agent card, sends one message (a text part and a data part) and
prints every StreamResponse it received (protobuf JSON) and the task read back
with GetTask, as one JSON object on stdout.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from a2a.client import ClientConfig, create_client
from a2a.types import GetTaskRequest, Message, Part, Role, SendMessageRequest
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Value


async def main(url: str, text: str, data: dict[str, Any], streaming: bool) -> dict[str, Any]:
    client = await create_client(url, client_config=ClientConfig(streaming=streaming))
    value = ParseDict(data, Value())
    message = Message(message_id="m-1", role=Role.ROLE_USER, parts=[Part(text=text), Part(data=value)])
    events = [MessageToDict(event) async for event in client.send_message(SendMessageRequest(message=message))]
    task_ids = [event["task"]["id"] for event in events if "task" in event]
    task = await client.get_task(GetTaskRequest(id=task_ids[0])) if task_ids else None
    await client.close()
    return {"events": events, "task": MessageToDict(task) if task is not None else None}


if __name__ == "__main__":
    mode = sys.argv[4] if len(sys.argv) > 4 else "send"
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), mode == "stream"))))
