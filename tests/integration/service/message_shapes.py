"""Input messages holding every key their shapes take (`service/api/message_keys.py`), as their
senders write them: the AI SDK's model and UI messages, Mastra's stored messages, and what
@mastra/client-js 1.47 sends to go on after a client tool. Data for test_message_keys.py."""

from __future__ import annotations

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
DATA_URL = f"data:image/png;base64,{PNG}"
TOOL_CALL = {"type": "tool-call", "toolCallId": "c1", "toolName": "weather", "input": {}}

OPTIONS = {"openai": {"user": "u1"}}
META = {"openai": {"itemId": "i1"}}
MODEL_USER = {
    "role": "user",
    "id": "m-model",
    "threadId": "ignored-thread",
    "resourceId": "ignored-resource",
    "createdAt": "2026-01-01T00:00:00.000Z",
    "type": "text",
    "toolCallIds": [],
    "toolCallArgs": [],
    "toolNames": [],
    "providerOptions": OPTIONS,
    "experimental_providerMetadata": OPTIONS,
    "content": [
        {
            "type": "text",
            "text": "look",
            "providerOptions": OPTIONS,
            "experimental_providerMetadata": OPTIONS,
        },
        {
            "type": "image",
            "image": PNG,
            "url": None,
            "data": None,
            "mediaType": "image/png",
            "mimeType": "image/png",
            "filename": "dot.png",
            "providerOptions": OPTIONS,
            "experimental_providerMetadata": OPTIONS,
        },
        {
            "type": "file",
            "data": DATA_URL,
            "url": None,
            "mediaType": "image/png",
            "mimeType": "image/png",
            "filename": "dot.png",
            "providerOptions": OPTIONS,
            "experimental_providerMetadata": OPTIONS,
            "providerMetadata": META,
        },
    ],
}
UI_USER = {
    "id": "m-ui",
    "role": "user",
    "threadId": "ignored-thread",
    "resourceId": "ignored-resource",
    "createdAt": "2026-01-01T00:00:01.000Z",
    "content": "and this",
    "toolInvocations": [],
    "reasoning": "",
    "revisionId": "r-1",
    "annotations": [{"seen": True}],
    "metadata": {"from": "ui"},
    "data": None,
    "parts": [{"type": "text", "text": "and this", "state": "done", "providerMetadata": META}],
    "experimental_attachments": [{"url": DATA_URL, "contentType": "image/png", "name": "dot.png"}],
}
STORED_FILE = {
    "type": "file",
    "data": PNG,
    "url": None,
    "mediaType": "image/png",
    "mimeType": "image/png",
    "filename": "dot.png",
    "providerMetadata": META,
    "createdAt": 1,
}
STORED = {
    "id": "m-stored",
    "role": "user",
    "createdAt": "2026-01-01T00:00:02.000Z",
    "threadId": "ignored-thread",
    "resourceId": "ignored-resource",
    "type": "v2",
    "content": {
        "format": 2,
        "content": "stored text",
        "metadata": {"k": 1},
        "toolInvocations": [],
        "reasoning": "",
        "annotations": [],
        "providerMetadata": META,
        "experimental_attachments": [],
        "parts": [
            {"type": "step-start", "model": "m", "providerMetadata": META, "createdAt": 1},
            {"type": "text", "text": "stored text", "providerMetadata": META, "createdAt": 1},
            {"type": "data-note", "id": "d1", "data": {"n": 1}, "providerMetadata": META, "createdAt": 1},
            STORED_FILE,
            {**STORED_FILE, "type": "image", "data": DATA_URL},
        ],
    },
}
STORED_ASSISTANT = {
    "id": "m-stored-answer",
    "role": "assistant",
    "content": {
        "format": 2,
        "parts": [
            {
                "type": "reasoning",
                "text": "hm",
                "reasoning": "hm",
                "details": [],
                "provider": "openai",
                "signature": "s",
                "providerMetadata": META,
                "createdAt": 1,
            },
            {
                "type": "tool-invocation",
                "provider": "openai",
                "providerExecuted": False,
                "title": "Weather",
                "preliminary": False,
                "providerMetadata": META,
                "createdAt": 1,
                "toolInvocation": {
                    "state": "result",
                    "step": 0,
                    "toolCallId": "c-old",
                    "toolName": "weather",
                    "args": {},
                    "result": "sunny",
                    "isError": False,
                    "errorText": "",
                    "rawInput": {},
                    "approval": {"id": "ap", "approved": True},
                    "provider": "openai",
                    "providerExecuted": False,
                    "providerMetadata": META,
                },
            },
        ],
    },
}


# What @mastra/client-js 1.47 sends to go on after a client tool (resources/agent.ts): generate's
# tool message (executeToolCallAndRespond), stream's (processStreamResponse: with the call's input),
# and without a thread the UI message it built from the stream (processChatResponse_vNext).
CLIENT_JS_CALL = {
    "role": "assistant",
    "content": [
        {"type": "text", "text": "Let me check."},
        {**TOOL_CALL, "args": {}, "providerExecuted": False, "providerOptions": OPTIONS,
         "experimental_providerMetadata": OPTIONS},
    ],
}  # fmt: skip
CLIENT_JS_RESULT = {
    "role": "tool",
    "content": [
        {
            "type": "tool-result",
            "toolCallId": "c1",
            "toolName": "weather",
            "input": {"city": "Paris"},
            "result": {"sky": "clear"},
            "output": {"type": "json", "value": {"sky": "clear"}},
            "providerOptions": {"mastra": {"modelOutput": {"type": "text", "value": "clear"}}},
            "experimental_providerMetadata": OPTIONS,
            "isError": False,
            "experimental_content": [],
            "__mastraObservability": {"parentContext": {}},
        }
    ],
}
UI_ASSISTANT = {
    "id": "a-1",
    "createdAt": "2026-01-01T00:00:03.000Z",
    "role": "assistant",
    "content": "Let me check.",
    "revisionId": "r-2",
    "toolInvocations": [{"state": "call", "step": 0, "toolCallId": "c1", "toolName": "weather", "args": {}}],
    "parts": [
        {"type": "step-start"},
        {
            "type": "tool-invocation",
            "providerMetadata": {"mastra": {"modelOutput": "clear"}},
            "providerExecuted": False,
            "toolInvocation": {
                "state": "call",
                "step": 0,
                "toolCallId": "c1",
                "toolName": "weather",
                "args": {"city": "Paris"},
                "observability": {"traceId": "t"},
                "requestContext": {},
                "providerExecuted": False,
                "providerMetadata": {"mastra": {"modelOutput": "clear"}},
                "dynamic": False,
            },
        },
        {
            "type": "tool-invocation",
            "toolInvocation": {
                "state": "result",
                "step": 0,
                "toolCallId": "c0",
                "toolName": "weather",
                "args": {},
                "result": "cloudy",
                "isError": False,
                "output": "cloudy",
            },
        },
    ],
}
UI_V5_ASSISTANT = {
    "id": "a-v5",
    "role": "assistant",
    "parts": [
        {"type": "step-start"},
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "output-available",
            "input": {"city": "Paris"},
            "output": {"tempC": 21},
            "providerExecuted": False,
            "callProviderMetadata": META,
            "preliminary": False,
            "title": "Weather",
            "approval": {"id": "ap-1", "approved": True},
        },
        {
            "type": "dynamic-tool",
            "toolName": "forecast",
            "dynamic": False,
            "toolCallId": "c2",
            "state": "output-error",
            "input": None,
            "rawInput": '{"city": "Par',
            "errorText": "invalid input",
        },
    ],
}
"""An AI SDK v5 / v6 UI assistant message with tool parts holding every key `UI_V5_TOOL` takes."""
