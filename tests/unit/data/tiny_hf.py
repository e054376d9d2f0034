"""Tiny Hugging Face tokenizers built in memory and saved with ``save_pretrained`` (no
download), for the chat-template and pre-tokenized data tests."""

from __future__ import annotations

SPECIALS = ["<unk>", "<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
WORDS = ("hello there how are you user assistant system fine thanks a b c "
         "sure here is the answer to your question")

_HEADER = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
_TAIL = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

CHATML_MARKERS = (_HEADER + "{% if m['role'] == 'assistant' %}{% generation %}"
                  "{{ m['content'] }}<|im_end|>{% endgeneration %}{% else %}"
                  "{{ m['content'] }}<|im_end|>{% endif %}\n{% endfor %}" + _TAIL)
"""ChatML whose assistant text is marked with {% generation %}."""

CHATML_PLAIN = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\na b<|im_end|>\n"
                "{% endif %}" + _HEADER + "{{ m['content'] }}<|im_end|>\n{% endfor %}" + _TAIL)
"""ChatML without markers, with a default system prompt (like Qwen2.5's)."""

DROPS_OLD_REPLIES = (_HEADER + "{% if m['role'] == 'assistant' and not loop.last %}"
                     "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}" + _TAIL)
"""Renders an assistant reply only while it is the last message: not prefix-stable."""

DATED = ("<|im_start|>system\n{{ strftime_now('%d %b %Y') }}<|im_end|>\n" + CHATML_PLAIN)
"""Prints today's date, as Llama 3.x's system header does."""

USER_FIRST = ("{% if messages[0]['role'] == 'assistant' %}"
              "{{ raise_exception('conversations start with the user') }}{% endif %}"
              + CHATML_MARKERS)
"""Refuses conversations that open with the assistant."""


def word_level_tokenizer(directory, chat_template: str | None):
    """A WordLevel tokenizer (whitespace split) with ChatML specials, saved to
    ``directory``; returns the directory as a string."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator([WORDS], trainers.WordLevelTrainer(special_tokens=SPECIALS))
    return _save(PreTrainedTokenizerFast(tokenizer_object=raw), directory, chat_template)


def byte_bpe_tokenizer(directory, chat_template: str | None):
    """A byte-level BPE tokenizer (merges across spaces and newlines possible) with ChatML
    specials, saved to ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator([WORDS, "user\nhello there\nassistant\nfine thanks\n"] * 20,
                            trainer)
    return _save(PreTrainedTokenizerFast(tokenizer_object=raw), directory, chat_template)


def _save(tokenizer, directory, chat_template):
    tokenizer.add_special_tokens({"unk_token": "<unk>", "pad_token": "<pad>",
                                  "bos_token": "<s>", "eos_token": "</s>",
                                  "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(str(directory))
    return str(directory)
