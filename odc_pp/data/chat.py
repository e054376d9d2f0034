"""Chat conversations -> token ids and the per-token "assistant wrote this" flags.

Two renderings:

* :func:`encode_role_headers`: the built-in format for tokenizers without a chat
  template (the byte-level one): every message is ``<|role|>\\n`` + content + end-of-document.
* :func:`encode_with_template`: a Hugging Face tokenizer's own ``chat_template``. Which
  tokens the assistant wrote comes from the template's ``{% generation %}`` markers when it
  has them (``return_assistant_tokens_mask``), else from rendering the conversation's
  prefixes: assistant message ``i`` spans the characters between the rendering of
  ``messages[:i]`` *with* the generation prompt (so the ``assistant`` header is not scored)
  and the rendering of ``messages[:i + 1]``; the full text is tokenized once and a token is
  scored when its characters overlap such a span (so BPE merges across a boundary cannot
  shift the mask). A template that renders an earlier message differently once later ones
  follow (not prefix-stable) is an error, not a guess.

Templates that print today's date (``strftime_now``, e.g. Llama 3.x's system header) get
the fixed :data:`TEMPLATE_DATE` instead, so every rank, and a resumed run, renders the same
text whatever the clock says.

Flags are per token of the returned ids (not yet shifted into next-token loss weights).
"""

from __future__ import annotations

import datetime
from typing import Any, Callable

__all__ = ["TEMPLATE_DATE", "SHAREGPT_ROLES", "check_messages", "sharegpt_messages",
           "encode_role_headers", "encode_with_template",
           "has_generation_markers"]

TEMPLATE_DATE = datetime.datetime(2024, 7, 26)
"""What a chat template's ``strftime_now`` formats (never the clock)."""


def check_messages(messages: Any) -> list[dict]:
    """``messages`` as a list of ``{"role": str, "content": str}``; ValueError naming the
    first bad entry otherwise."""
    if not isinstance(messages, list):
        raise ValueError(f"'messages' must be a list of {{\"role\", \"content\"}} objects, "
                         f"got a JSON {json_type(messages)}")
    if not messages:
        raise ValueError("'messages' is empty")
    for position, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{position}] must be an object with 'role' and "
                             f"'content', got a JSON {json_type(message)}")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "no key" if key not in message else f"a JSON {json_type(message[key])}"
                raise ValueError(f"messages[{position}].{key} must be a string, got {got}")
    return messages


SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool", "function_call": "assistant",
                  "observation": "tool"}
"""ShareGPT's ``from`` values -> chat roles (Hugging Face SFT sets such as Magpie's and
ShareGPT's store ``{"conversations": [{"from": "human", "value": ...}, ...]}``)."""


def sharegpt_messages(conversations: Any) -> list[dict]:
    """A ShareGPT ``conversations`` list as ``[{"role", "content"}, ...]``; ValueError naming
    the first bad turn."""
    if not isinstance(conversations, list):
        raise ValueError(f"'conversations' must be a list of {{\"from\", \"value\"}} objects, "
                         f"got a JSON {json_type(conversations)}")
    messages = []
    for position, turn in enumerate(conversations):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise ValueError(f"conversations[{position}] must be an object with a string "
                             f"'value', got {turn!r:.60}")
        speaker = turn.get("from")
        if speaker not in SHAREGPT_ROLES:
            raise ValueError(f"conversations[{position}].from = {speaker!r} is not one of "
                             f"{sorted(SHAREGPT_ROLES)}")
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": turn["value"]})
    return check_messages(messages)


def encode_role_headers(messages: list[dict], encode: Callable[[str], list[int]],
                        eod: int) -> tuple[list[int], list[int]]:
    """The built-in chat format: ``<|role|>\\n`` + content + end-of-document per message;
    the assistant's content and its end-of-document token are flagged."""
    ids: list[int] = []
    flags: list[int] = []
    for message in check_messages(messages):
        header = encode(f"<|{message['role']}|>\n")
        body = encode(message["content"]) + [eod]
        ids += header + body
        flags += [0] * len(header) + [int(message["role"] == "assistant")] * len(body)
    return ids, flags


def has_generation_markers(template: str) -> bool:
    """Whether a Jinja chat template marks assistant text with ``{% generation %}``."""
    compact = "".join(template.split())
    return any(tag in compact for tag in ("{%generation%}", "{%-generation", "{%generation-"))


def encode_with_template(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of ``messages`` rendered by a ``transformers`` tokenizer's chat template,
    and a 0/1 flag per token: 1 where the assistant wrote it (see the module docstring)."""
    check_messages(messages)
    template = tokenizer.chat_template
    if not isinstance(template, str):
        raise ValueError("the tokenizer's chat_template is not a single template string; "
                         "give --tokenizer-model a tokenizer with one chat template")
    if has_generation_markers(template):
        out = _template_call(tokenizer, messages, tokenize=True, return_dict=True,
                             return_assistant_tokens_mask=True)
        return list(out["input_ids"]), [int(v) for v in out["assistant_masks"]]
    full = _render(tokenizer, messages, generation_prompt=False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:index], generation_prompt=True)
        after = _render(tokenizer, messages[:index + 1], generation_prompt=False)
        if not (after.startswith(before) and full.startswith(after)):
            raise ValueError(f"the chat template renders messages[{index}] differently once "
                             f"later messages follow (it is not prefix-stable), so its "
                             f"assistant tokens cannot be found; use a template with "
                             f"{{% generation %}} markers")
        spans.append((len(before), len(after)))
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    flags = [int(any(start < end_span and end > start_span for start_span, end_span in spans))
             for start, end in encoded["offset_mapping"]]
    return list(encoded["input_ids"]), flags


def _render(tokenizer, messages: list[dict], *, generation_prompt: bool) -> str:
    if not messages:  # the prompt before an opening assistant turn
        try:
            return _template_call(tokenizer, [], tokenize=False,
                                  add_generation_prompt=generation_prompt)
        except ValueError as exc:
            raise ValueError(f"messages[0] is an assistant turn and the chat template cannot "
                             f"render the empty prompt before it ({exc}); start the "
                             f"conversation with a system or user message") from exc
    return _template_call(tokenizer, messages, tokenize=False,
                          add_generation_prompt=generation_prompt)


def _template_call(tokenizer, messages: list[dict], **kwargs):
    """``apply_chat_template``; a template's own error (e.g. "roles must alternate")
    becomes a ValueError carrying its message."""
    try:
        return tokenizer.apply_chat_template(messages, strftime_now=TEMPLATE_DATE.strftime,
                                             **kwargs)
    except ValueError:
        raise
    except Exception as exc:  # jinja2 TemplateError and what templates raise
        raise ValueError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc


def json_type(value) -> str:
    """The JSON name of a decoded value's type (for error messages)."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
             float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
