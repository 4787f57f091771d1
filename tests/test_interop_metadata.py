"""What makes a model usable travels both ways (issue 28): an Instruct-style model (two eos ids, a chat
template in chat_template.jinja, sampling defaults in generation_config.json, no special_tokens_map.json)
goes HF -> import-hf -> export, and through prepare-data's data directory (the tokenizer a fine-tune
exports with) -> export; every piece comes back, and transformers reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hostile_cases import run_cli
from interop_cases import needs_safetensors, transformers_or_skip
from tokenizer_cases import write_corpus, write_tiny_tokenizer
from truestep.cli.interop import interop_main
from truestep.cli.prepare_data import prepare_data_main
from truestep.config.schema import ModelConfig
from truestep.data.meta import read_meta
from truestep.interop.hf import hf_config
from truestep.interop.names import to_hf
from truestep.interop.tokenizer_export import checkpoint_tokenizer
from truestep.model.llama import Transformer

pytestmark = needs_safetensors

CFG = ModelConfig(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=32, multiple_of=16, max_seq_len=64)
EOT = "<|eot_id|>"
TEMPLATE = "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }} <|eot_id|>{% endfor %}"
SAMPLING = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}


def instruct_dir(directory: Path) -> int:
    """The source model directory; returns the second eos id (the turn end)."""
    from safetensors.torch import save_file
    from tokenizers import AddedToken, Tokenizer

    write_tiny_tokenizer(directory)
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(EOT, special=True)])
    tok.save(str(directory / "tokenizer.json"))
    eot = tok.token_to_id(EOT)
    config = {**hf_config(CFG), "bos_token_id": 1, "eos_token_id": [2, eot]}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": [2, eot], **SAMPLING})
    )
    (directory / "chat_template.jinja").write_text(TEMPLATE)
    model = Transformer(CFG)
    model.init_weights(0)
    save_file(
        {to_hf(k): v.detach().contiguous() for k, v in model.state_dict().items()},
        str(directory / "model.safetensors"),
    )
    return eot


def ok(main, *argv: object) -> None:
    rc, _, err = run_cli(main, *argv)
    assert rc == 0, err


def check_export(out: Path, eot: int) -> None:
    assert (out / "chat_template.jinja").read_text() == TEMPLATE
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == [2, eot]
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, eot] and generation["bos_token_id"] == 1
    assert {k: generation[k] for k in SAMPLING} == SAMPLING
    special = json.loads((out / "special_tokens_map.json").read_text())
    assert (special["bos_token"], special["eos_token"]) == ("<s>", "</s>")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, Path, int]:
    base = tmp_path_factory.mktemp("instruct")
    eot = instruct_dir(base / "hf")
    ok(interop_main, "import-hf", base / "hf", "--out", base / "ckpt")
    return base / "hf", base / "ckpt" / "step_00000000", eot


def test_import_then_export_keeps_template_eos_list_and_defaults(source, tmp_path: Path) -> None:
    _, step, eot = source
    assert checkpoint_tokenizer(step).eos_ids() == [2, eot]  # what generate stops at
    ok(interop_main, "export", step, "--to", "hf", tmp_path / "out")
    check_export(tmp_path / "out", eot)


def test_the_data_directory_path_keeps_them_too(source, tmp_path: Path) -> None:
    """A fine-tune's export takes its tokenizer from the data directory prepare-data wrote."""
    hf, step, eot = source
    texts = write_corpus(tmp_path / "text", documents=2, words=50)
    ok(prepare_data_main, *texts, "--out", tmp_path / "data", "--tokenizer", hf / "tokenizer.json")
    meta = read_meta(tmp_path / "data")
    assert {"chat_template.jinja", "generation_config.json"} <= set(meta["tokenizer_files"])
    assert meta["bos_id"] == 1  # BOS as the tokenizer adds it (--bos auto)
    assert checkpoint_tokenizer(step, tmp_path / "data").eos_ids() == [2, eot]
    ok(interop_main, "export", step, "--to", "hf", tmp_path / "out", "--data", tmp_path / "data")
    check_export(tmp_path / "out", eot)


def test_transformers_reads_the_template_and_the_eos_list(source, tmp_path: Path) -> None:
    transformers = transformers_or_skip()
    _, step, eot = source
    ok(interop_main, "export", step, "--to", "hf", tmp_path / "out")
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    text = tok.apply_chat_template([{"role": "user", "content": "the cat"}], tokenize=False)
    assert text == "<s> user the cat <|eot_id|>"
    generation = transformers.GenerationConfig.from_pretrained(str(tmp_path / "out"))
    assert generation.eos_token_id == [2, eot] and generation.do_sample and generation.top_p == 0.9


@pytest.mark.multiprocess
def test_a_fine_tune_exports_them_and_generate_knows_the_eos_list(source, tmp_path: Path) -> None:
    """HF -> import -> fine-tune on prepare-data output (a real single-process run) -> export: the
    template, both eos ids, the sampling defaults and the special tokens map come back."""
    from harness import launch
    from truestep.checkpoint.catalog import step_dir_name

    hf, step, eot = source
    texts = write_corpus(tmp_path / "text", documents=20, words=100)
    ok(prepare_data_main, *texts, "--out", tmp_path / "data", "--tokenizer", hf / "tokenizer.json")
    run = tmp_path / "run"
    launch(
        run,
        "--model.dim=16",
        "--model.n_layers=1",
        "--model.n_heads=2",
        "--model.n_kv_heads=1",
        "--model.vocab_size=32",
        "--model.multiple_of=16",
        f"--checkpoint.init_from={step}",
        f"--data.path={tmp_path / 'data'}",
        "--train.max_steps=2",
        "--checkpoint.interval=0",
        "--schedule.warmup_steps=1",
    )
    tuned = run / "checkpoints" / step_dir_name(2)
    assert checkpoint_tokenizer(tuned).eos_ids() == [2, eot]  # what generate stops at
    ok(interop_main, "export", tuned, "--to", "hf", tmp_path / "out")
    check_export(tmp_path / "out", eot)


# ----------------------------------------------------------------------------------------------
# every tokenizer convention export accepts comes back as it was read (issue 40)

CONVENTIONS = ("transformers-5", "transformers-4", "bare")
"""transformers 5 writes tokenizer_config.json (its eos_token the turn end) and chat_template.jinja, no
special_tokens_map.json; transformers 4 also writes the map; a bare tokenizer.json has neither config."""


def convention_dir(directory: Path, convention: str) -> None:
    """An Instruct-style source whose tokenizer names `<|eot_id|>` as eos_token while config.json's first
    eos id is `</s>` (Llama 3 Instruct: eos_token `<|eot_id|>`, first eos id `<|end_of_text|>`)."""
    instruct_dir(directory)
    named = {"bos_token": "<s>", "eos_token": EOT, "pad_token": "<pad>", "unk_token": "<unk>"}
    if convention == "bare":
        (directory / "tokenizer_config.json").unlink()
        return
    config = {"backend": "tokenizers", "tokenizer_class": "TokenizersBackend", **named}
    if convention == "transformers-4":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        del config["backend"]
        (directory / "special_tokens_map.json").write_text(json.dumps(named))
    (directory / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_export_keeps_the_special_tokens_it_read(convention: str, tmp_path: Path) -> None:
    transformers = transformers_or_skip()
    convention_dir(tmp_path / "hf", convention)
    ok(interop_main, "import-hf", tmp_path / "hf", "--out", tmp_path / "ckpt")
    ok(interop_main, "export", tmp_path / "ckpt" / "step_00000000", "--to", "hf", tmp_path / "out")
    out = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    written = json.loads((tmp_path / "out" / "special_tokens_map.json").read_text())
    if convention == "bare":  # nothing named them: the ids say (bos, the first eos, no pad id known)
        assert (out.bos_token, out.eos_token) == ("<s>", "</s>") and written["eos_token"] == "</s>"
        return
    source = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert source.eos_token == EOT
    assert (out.bos_token, out.eos_token, out.pad_token) == (source.bos_token, EOT, source.pad_token)
    assert written["eos_token"] == EOT  # the map written beside the config says what the config says
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes(), name


def test_the_data_directory_keeps_the_special_tokens_too(tmp_path: Path) -> None:
    """A fine-tune's export (tokenizer from prepare-data's copy) of a transformers-5 tokenizer."""
    transformers = transformers_or_skip()
    convention_dir(tmp_path / "hf", "transformers-5")
    ok(interop_main, "import-hf", tmp_path / "hf", "--out", tmp_path / "ckpt")
    texts = write_corpus(tmp_path / "text", documents=2, words=50)
    ok(
        prepare_data_main,
        *texts,
        "--out",
        tmp_path / "data",
        "--tokenizer",
        tmp_path / "hf" / "tokenizer.json",
    )
    step = tmp_path / "ckpt" / "step_00000000"
    ok(interop_main, "export", step, "--to", "hf", tmp_path / "out", "--data", tmp_path / "data")
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out")).eos_token == EOT


def test_a_chat_template_without_its_tokenizer_is_named_not_dropped(tmp_path: Path) -> None:
    """A chat_template.jinja beside a model that has no tokenizer.json cannot be kept (nothing to apply it
    with); import says so in one line instead of dropping it without a word."""
    instruct_dir(tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.json").unlink()
    (tmp_path / "hf" / "tokenizer_config.json").unlink()
    rc, out, err = run_cli(interop_main, "import-hf", tmp_path / "hf", "--out", tmp_path / "ckpt")
    assert rc == 0, err
    [line] = [x for x in out.splitlines() if x.startswith("not kept:")]
    assert "chat_template.jinja" in line and "generation_config.json" in line and "tokenizer.json" in line
