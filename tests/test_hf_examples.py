"""examples/hf_*.py run as written, each here with tiny arguments (a 2-layer model, a few steps) on the
first lines of the real Multi30k; docs/beyond-fairseq.md shows their default commands (checked in
test_docs_commands.py: each --help lists every flag the command uses)."""

import importlib
import sys

import pytest

from conftest import REPO

from hf_available import require_transformers  # noqa: E402

require_transformers()

TINY = ["--train-lines", "200", "--valid-lines", "20", "--steps", "4", "--layers", "2", "--dim", "32"]


def example(name: str):
    """examples/NAME.py as a module (its folder first on sys.path, as ``python examples/NAME.py`` has it)."""
    path = str(REPO / "examples")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(name)


@pytest.fixture(autouse=True)
def shared(shared_data, monkeypatch):
    monkeypatch.setenv("TFIXUP_SHARED_DATA", str(shared_data))
    monkeypatch.setattr(example("multi30k"), "DATA", shared_data / "multi30k")


def test_translation_example_trains_marian_without_layernorm_and_translates(capsys):
    example("hf_translation").main(TINY)
    out = capsys.readouterr().out
    assert "T-Fixup scaled" in out and "LayerNorms left: 0" in out
    assert out.count("valid loss") == 4 and out.count("translated: ") == 3


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_causal_lm_example_trains_without_norms(model, capsys):
    example("hf_causal_lm").main([*TINY, "--model", model])
    out = capsys.readouterr().out
    assert {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}[model] in out and "T-Fixup scaled" in out
    assert "unigram level" in out and out.count("valid perplexity") == 6  # header, step 0, four steps
    assert "T-Fixup scaled" in out and "kept" not in out


def test_causal_lm_example_keeps_the_norm_before_each_gated_mlp(capsys):
    example("hf_causal_lm").main([*TINY, "--model", "llama", "--keep-mlp-norm"])
    out = capsys.readouterr().out
    assert "kept 2 RMSNorms (one before each gated MLP);" in out and out.count("valid perplexity") == 6  # 2 layers


def test_masked_lm_example_trains_bert_without_layernorm(capsys):
    example("hf_masked_lm").main(TINY)
    out = capsys.readouterr().out
    assert "BERT, 2 layers" in out and "T-Fixup scaled" in out and "unigram level" in out
    assert out.count("masked-word valid perplexity") == 5


@pytest.mark.parametrize("content,words", [(None, "no such file"), (b"", "empty"),
                                           ("gzip", "empty"), (b"not gzip", "not gzip-compressed UTF-8"),
                                           ("latin1", "not gzip-compressed UTF-8")])
def test_examples_refuse_a_missing_empty_or_undecodable_data_file_in_one_line(content, words, tmp_path,
                                                                              monkeypatch, capsys):
    import gzip

    data = tmp_path / "multi30k"
    data.mkdir()
    path = data / "train.en.gz"
    if content == "gzip":
        path.write_bytes(gzip.compress(b"\n\n"))
    elif content == "latin1":
        path.write_bytes(gzip.compress("ein Mädchen\n".encode("latin-1")))
    elif content is not None:
        path.write_bytes(content)
    monkeypatch.setattr(example("multi30k"), "DATA", data)
    for name in ("hf_causal_lm", "hf_trainer"):
        with pytest.raises(SystemExit) as done:
            example(name).main([*TINY[:4], "--out", str(tmp_path / "out")] if name == "hf_trainer" else TINY)
        message = str(done.value.code)
        assert message.startswith(f"error: {path}: ") and words in message and "\n" not in message, message
    assert not (tmp_path / "out").exists()
