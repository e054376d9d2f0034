"""tools/export_hf.py copies the tokenizer with its chat template by default (issue 33,
Deliver 6): transformers' ``apply_chat_template`` on the exported directory gives the
source's text, whether the source keeps the template in ``chat_template.jinja`` or inside
``tokenizer_config.json``. Tiny tokenizers built locally (no download)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from tests.unit.data.tiny_hf import CHATML_PLAIN, word_level_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
MESSAGES = [{"role": "user", "content": "hello there how are you"},
            {"role": "assistant", "content": "fine thanks"}]


@pytest.fixture(scope="module")
def export_hf():
    import sys

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    spec = importlib.util.spec_from_file_location("export_hf_tool",
                                                  os.path.join(ROOT, "tools", "export_hf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _chat_text(directory: str) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    return tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)


def _inline_template_source(directory) -> str:
    """A source whose template lives only in tokenizer_config.json (older transformers)."""
    source = word_level_tokenizer(directory, CHATML_PLAIN)
    jinja = os.path.join(source, "chat_template.jinja")
    if os.path.exists(jinja):
        os.remove(jinja)
        path = os.path.join(source, "tokenizer_config.json")
        config = json.loads(open(path, encoding="utf-8").read())
        config["chat_template"] = CHATML_PLAIN
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle)
    return source


@pytest.mark.parametrize("where", ["jinja", "tokenizer_config"])
def test_exported_chat_template_renders_the_sources_text(export_hf, tmp_path, where):
    source = word_level_tokenizer(tmp_path / "src", CHATML_PLAIN) if where == "jinja" \
        else _inline_template_source(tmp_path / "src")
    expected = _chat_text(source)
    assert expected.startswith("<|im_start|>system\na b<|im_end|>")
    out = tmp_path / "out"
    copied = export_hf.copy_tokenizer(source, str(out))
    assert "tokenizer.json" in copied and "tokenizer_config.json" in copied
    if where == "jinja":
        assert "chat_template.jinja" in copied
    assert _chat_text(str(out)) == expected


def test_a_directory_without_a_tokenizer_is_an_error_naming_the_flag(export_hf, tmp_path):
    with pytest.raises(ValueError, match="--tokenizer-from"):
        export_hf.copy_tokenizer(str(tmp_path), str(tmp_path / "out"))


def _checkpoint(tmp_path, tokenizer_dir) -> str:
    from odc_pp.training.checkpoint.checkpointing import LATEST, checkpoint_dir

    load = str(tmp_path / "ckpt")
    directory = checkpoint_dir(load, 7)
    os.makedirs(directory)
    with open(os.path.join(load, LATEST), "w") as handle:
        handle.write("7")
    with open(os.path.join(directory, "meta.json"), "w") as handle:
        json.dump({"world_size": 1, "tokenizer_dir": tokenizer_dir}, handle)
    return load


def test_main_copies_the_runs_tokenizer_by_default(export_hf, tmp_path, monkeypatch, capsys):
    source = word_level_tokenizer(tmp_path / "src", CHATML_PLAIN)
    load = _checkpoint(tmp_path, source)
    out = tmp_path / "out"

    def weights_only(load_, output, **_):  # the weights' export is tested in e2e/models
        os.makedirs(output, exist_ok=True)
        return 7, {"model_type": "llama", "tie_word_embeddings": False}, ["model.safetensors"]

    monkeypatch.setattr(export_hf, "export_hf", weights_only)
    assert export_hf.main(["--load", load, "--output", str(out)]) == 0
    assert "with a chat template" in capsys.readouterr().out
    assert (out / "chat_template.jinja").exists()
    assert _chat_text(str(out)) == _chat_text(source)

    skipped = tmp_path / "skipped"
    assert export_hf.main(["--load", load, "--output", str(skipped), "--no-tokenizer"]) == 0
    assert not (skipped / "tokenizer.json").exists()


def test_tokenizer_source(export_hf, tmp_path):
    source = word_level_tokenizer(tmp_path / "src", None)
    assert export_hf.tokenizer_source(_checkpoint(tmp_path / "a", source), 7, None) == source
    assert export_hf.tokenizer_source(_checkpoint(tmp_path / "b", source), 7, "X") == "X"
    # an --hf-checkpoint directory with weights only, or no recorded directory: nothing
    assert export_hf.tokenizer_source(_checkpoint(tmp_path / "c", str(tmp_path)), 7,
                                      None) is None
    assert export_hf.tokenizer_source(_checkpoint(tmp_path / "d", None), 7, None) is None
