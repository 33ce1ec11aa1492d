"""Conversations: records as chat turns, rendered with the tokenizer's template, and the spans a model learns.

Alpaca and messages records both become a list of {role, content} turns; the rendered text's assistant replies
(each with its end-of-turn marker) are what the loss sees, everything else is masked (see samples.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..boundary.common import RunError

ROLES = ("system", "user", "assistant")
SPECIAL_TOKENS = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
#: Used by the random twin, and by a pretrained tokenizer that has no template of its own. Role markers are
#: special tokens of the twin's tokenizer; each turn ends with eos, so a model learns to stop after its answer.
CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def conversations(batch: dict[str, list], fmt: str) -> Iterator[list[dict[str, str]]]:
    """The batch's records as chat turns; an alpaca record is one user turn and one assistant turn."""
    if fmt == "messages":
        for messages in batch["messages"]:
            yield [{"role": m["role"], "content": m["content"]} for m in messages]
        return
    inputs = batch.get("input") or [None] * len(batch["instruction"])
    for instruction, given, output in zip(batch["instruction"], inputs, batch["output"]):
        prompt = f"{instruction}\n\n{given}" if given else instruction
        yield [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]


def render_chat(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(tokenizer: Any, messages: list[dict[str, str]], text: str) -> list[tuple[int, int]]:
    """Character spans of ``text`` that the model must learn: each assistant reply and its end-of-turn marker.

    A reply starts where the conversation up to it, rendered with the generation prompt, ends; it ends where the
    conversation including it ends. That holds for any template that renders a conversation as a prefix of its
    continuation, which is checked.
    """
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(render_chat(tokenizer, messages[:index], generation_prompt=True))
        # the whole conversation is rendered already: one render less per record for the common single answer
        upto = text if index == len(messages) - 1 else render_chat(tokenizer, messages[: index + 1])
        if not text.startswith(upto) or start > len(upto):
            raise RunError(
                "the tokenizer's chat template does not render a conversation as a prefix of its "
                "continuation, so prompt tokens cannot be masked"
            )
        spans.append((start, len(upto)))
    return spans
