"""Hostile Hugging Face directories (issue 12): `truestep import-hf` believes nothing a directory declares
before checking it against what is there, refuses bad weights, never follows a name out of the
directory, never hangs on a FIFO, and answers every refusal in one line (exit 3).

No training: a tiny valid Llama directory is written once per module from a freshly initialized model
(config.json from truestep's own `hf_config`, weights with safetensors), and every case edits a copy.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import harness
from hostile_cases import mkfifo, one_line, run_cli, within
from interop_cases import needs_safetensors
from truestep.cli.interop import interop_main
from truestep.config.schema import ModelConfig
from truestep.interop.hf import hf_config
from truestep.interop.names import to_hf
from truestep.model.llama import Transformer

pytestmark = needs_safetensors

CFG = ModelConfig(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=32, multiple_of=16, max_seq_len=64)
INDEX = "model.safetensors.index.json"


def hf_weights() -> dict[str, torch.Tensor]:
    model = Transformer(CFG)
    model.init_weights(0)
    return {to_hf(k): v.detach().contiguous() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def valid_dir(tmp_path_factory) -> Path:
    from safetensors.torch import save_file

    d = tmp_path_factory.mktemp("hf") / "tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(hf_config(CFG)))
    save_file(hf_weights(), str(d / "model.safetensors"))
    return d


@pytest.fixture
def hf_dir(valid_dir, tmp_path) -> Path:
    return Path(shutil.copytree(valid_dir, tmp_path / "hf"))


def refused(hf_dir: Path, out: Path, why: str) -> None:
    """import-hf exits 3 with one line containing `why` (within 60 s: nothing may hang) and writes nothing."""
    rc, _, err = within(60, lambda: run_cli(interop_main, "import-hf", hf_dir, "--out", out))
    assert rc == 3, err
    assert why in one_line(err), err
    assert not out.exists() or not any(out.iterdir())


def edit_config(hf_dir: Path, **changes: object) -> None:
    config = json.loads((hf_dir / "config.json").read_text())
    config.update(changes)
    (hf_dir / "config.json").write_text(json.dumps(config))


def save(hf_dir: Path, tensors: dict[str, torch.Tensor], name: str = "model.safetensors") -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(hf_dir / name))


def test_the_valid_directory_imports(hf_dir, tmp_path):
    rc, out, err = run_cli(interop_main, "import-hf", hf_dir, "--out", tmp_path / "ckpt")
    assert rc == 0, err


# ---------------------------------------------------------------------------------------------- sizes


@pytest.mark.slow  # over ~2 s here: the whole suite, not the fast tier
def test_a_config_declaring_100000_layers_is_answered_at_once(hf_dir, tmp_path):
    """A 671-byte config.json with num_hidden_layers=100000 made import-hf build a 100000-layer model on
    the meta device (2 min, 4.5 GB) before comparing shapes. Measured in a fresh process: time and peak
    RSS of the whole command."""
    edit_config(hf_dir, num_hidden_layers=100_000)
    code = (
        "import resource, sys, time\n"
        "from truestep.cli.main import main\n"
        "t = time.perf_counter()\n"
        f"rc = main(['import-hf', {str(hf_dir)!r}, '--out', {str(tmp_path / 'ckpt')!r}])\n"
        "print(rc, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=harness.truestep_env(), timeout=300
    )
    rc, seconds, max_rss_kib = proc.stdout.split()
    assert rc == "3", proc.stderr
    assert "config.json implies 100000 layers, the safetensors holds 2" in one_line(proc.stderr)
    assert float(seconds) < 20, seconds
    assert int(max_rss_kib) < 1_500_000, max_rss_kib  # KiB: torch itself is ~400 MB


@pytest.mark.parametrize(
    "changes,why",
    [
        ({"max_position_embeddings": 10**12}, "model.max_seq_len=1000000000000 is beyond 1048576"),
        (
            {"rope_theta": 0, "rope_parameters": {"rope_type": "default", "rope_theta": 0}},
            "model.rope_theta must be positive",
        ),
        ({"rope_theta": -5.0, "rope_parameters": None}, "model.rope_theta must be positive"),
        ({"rope_theta": 10000.0}, "rope_theta=10000.0 and rope_parameters.rope_theta=500000.0 differ"),
        ({"rms_norm_eps": float("inf")}, "model.norm_eps=inf must be a finite number"),
        ({"rms_norm_eps": float("nan")}, "model.norm_eps=nan must be a finite number"),
        ({"hidden_size": 10**400}, "out of range"),
        (
            {"num_hidden_layers": 10**30},
            "model.n_layers=1000000000000000000000000000000 does not fit in 64 bits",
        ),
        ({"rms_norm_eps": "small"}, "values of the wrong type: rms_norm_eps='small'"),
        ({"hidden_size": True}, "missing or invalid hidden_size"),
        ({"intermediate_size": 10**40}, "cannot express intermediate_size"),
    ],
)
def test_declared_values_are_validated_before_anything_is_built(changes, why, hf_dir, tmp_path):
    edit_config(hf_dir, **changes)
    refused(hf_dir, tmp_path / "ckpt", why)


def test_a_header_declaring_more_bytes_than_the_file_holds(hf_dir, tmp_path):
    """A safetensors header claiming a 10^12-element tensor in a small file: refused by the header
    check, never allocated."""
    path = hf_dir / "model.safetensors"
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    name = "model.embed_tokens.weight"
    header[name]["shape"] = [10**6, 10**6]
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data[8 + size :])
    refused(hf_dir, tmp_path / "ckpt", "not a readable safetensors file")


def test_a_truncated_safetensors_file(hf_dir, tmp_path):
    path = hf_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    refused(hf_dir, tmp_path / "ckpt", "not a readable safetensors file")


# ---------------------------------------------------------------------------------------------- weights


def test_nan_weights_are_refused(hf_dir, tmp_path):
    tensors = hf_weights()
    tensors["model.layers.1.mlp.down_proj.weight"][0, 0] = float("nan")
    save(hf_dir, tensors)
    refused(hf_dir, tmp_path / "ckpt", "model.layers.1.mlp.down_proj.weight holds NaN or infinite values")


def test_infinite_weights_are_refused(hf_dir, tmp_path):
    tensors = hf_weights()
    tensors["model.norm.weight"][3] = float("-inf")
    save(hf_dir, tensors)
    refused(hf_dir, tmp_path / "ckpt", "model.norm.weight holds NaN or infinite values")


@pytest.mark.parametrize("dtype,kind", [(torch.int32, "I32"), (torch.int8, "I8"), (torch.bool, "BOOL")])
def test_integer_weights_are_refused(dtype, kind, hf_dir, tmp_path):
    tensors = hf_weights()
    tensors["model.layers.0.self_attn.q_proj.weight"] = tensors["model.layers.0.self_attn.q_proj.weight"].to(
        dtype
    )
    save(hf_dir, tensors)
    refused(hf_dir, tmp_path / "ckpt", f"model.layers.0.self_attn.q_proj.weight is stored as {kind}")


# ---------------------------------------------------------------------------------------------- shards


def shard(hf_dir: Path, first: dict, second: dict, weight_map: dict) -> None:
    (hf_dir / "model.safetensors").unlink()
    save(hf_dir, first, "model-00001-of-00002.safetensors")
    save(hf_dir, second, "model-00002-of-00002.safetensors")
    (hf_dir / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def split(tensors: dict[str, torch.Tensor]) -> tuple[dict, dict, dict]:
    names = sorted(tensors)
    first = {n: tensors[n] for n in names[: len(names) // 2]}
    second = {n: tensors[n] for n in names[len(names) // 2 :]}
    weight_map = {
        **dict.fromkeys(first, "model-00001-of-00002.safetensors"),
        **dict.fromkeys(second, "model-00002-of-00002.safetensors"),
    }
    return first, second, weight_map


def test_a_valid_sharded_directory_imports(hf_dir, tmp_path):
    shard(hf_dir, *split(hf_weights()))
    rc, _, err = run_cli(interop_main, "import-hf", hf_dir, "--out", tmp_path / "ckpt")
    assert rc == 0, err


def test_one_tensor_in_two_shards_is_refused(hf_dir, tmp_path):
    """The later shard's copy used to win whatever the index said."""
    first, second, weight_map = split(hf_weights())
    name = next(iter(second))
    first[name] = torch.zeros_like(second[name])
    shard(hf_dir, first, second, weight_map)
    refused(
        hf_dir, tmp_path / "ckpt", f"{name} is stored in model-00001-of-00002.safetensors, but {INDEX} says"
    )


def test_a_tensor_not_where_the_index_says_is_refused(hf_dir, tmp_path):
    first, second, weight_map = split(hf_weights())
    name = next(iter(first))
    weight_map[name] = "model-00002-of-00002.safetensors"
    shard(hf_dir, first, second, weight_map)
    refused(
        hf_dir, tmp_path / "ckpt", f"{name} is stored in model-00001-of-00002.safetensors, but {INDEX} says"
    )


def test_a_tensor_the_index_lists_but_no_file_holds(hf_dir, tmp_path):
    first, second, weight_map = split(hf_weights())
    weight_map["model.layers.7.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
    shard(hf_dir, first, second, weight_map)
    refused(hf_dir, tmp_path / "ckpt", "lists tensors no file holds: model.layers.7.mlp.up_proj.weight")


@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd", "sub/model.safetensors", ""])
def test_index_entries_outside_the_directory_are_refused(target, hf_dir, tmp_path):
    outside = hf_dir.parent / "outside.safetensors"
    shutil.copy(hf_dir / "model.safetensors", outside)
    first, second, weight_map = split(hf_weights())
    weight_map[next(iter(first))] = target
    shard(hf_dir, first, second, weight_map)
    refused(hf_dir, tmp_path / "ckpt", "weight_map entries must name files inside the directory")


# ---------------------------------------------------------------------------------------------- files


@pytest.mark.parametrize(
    "name", ["config.json", "model.safetensors", INDEX, "generation_config.json", "tokenizer.json"]
)
def test_a_fifo_anywhere_hangs_nothing(name, hf_dir, tmp_path):
    if name == "generation_config.json":
        edit_config(hf_dir, eos_token_id=None)  # so that generation_config.json is read
    if (hf_dir / name).exists():
        (hf_dir / name).unlink()
    mkfifo(hf_dir / name)
    rc, _, err = within(60, lambda: run_cli(interop_main, "import-hf", hf_dir, "--out", tmp_path / "ckpt"))
    assert rc == 3 and ("FIFO" in one_line(err) or "not a regular file" in one_line(err)), err


@pytest.mark.parametrize(
    "text,why",
    [
        ("[" * 100_000 + "]" * 100_000, "not valid JSON: RecursionError"),
        ('{"hidden_size": ' + "9" * 5000 + "}", "not valid JSON: ValueError"),
        ("\x00\x01 not json", "not valid JSON"),
        ("[1, 2, 3]", "is not a JSON object"),
    ],
)
def test_malformed_config_json_is_one_line(text, why, hf_dir, tmp_path):
    (hf_dir / "config.json").write_text(text)
    refused(hf_dir, tmp_path / "ckpt", why)


def test_a_symlinked_hf_cache_layout_still_imports(hf_dir, tmp_path):
    """The Hugging Face cache keeps snapshot files as symlinks into its blob store, outside the snapshot
    directory (`../../blobs/<hash>`): names are confined, those links are followed (only for reading)."""
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    for n, name in enumerate(("config.json", "model.safetensors")):
        (hf_dir / name).rename(repo / "blobs" / f"blob{n}")
        os.symlink(f"../../blobs/blob{n}", snapshot / name)
    rc, _, err = run_cli(interop_main, "import-hf", snapshot, "--out", tmp_path / "ckpt")
    assert rc == 0, err


@pytest.mark.multiprocess
def test_export_of_a_rank_file_declaring_100000_layers(reference, tmp_path):
    """`export` believed model.n_layers of a checkpoint's rank file and built that model first. Now the
    layer count is compared with the tensors stored: one line, fast, little memory."""
    from ckpt_cases import ckpt
    from hostile_cases import copy_step, edit_rank_state

    d = copy_step(ckpt(reference, 6), tmp_path / "checkpoints")

    def edit(record):
        record["config_keys"]["model.n_layers"] = 100_000

    edit_rank_state(d, edit)
    started = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rc, _, err = run_cli(interop_main, "export", d, "--to", "torch", tmp_path / "w.pt")
    assert rc == 3, err
    assert "model expects 100000 layers, the checkpoint holds 2" in one_line(err)
    assert time.perf_counter() - started < 20
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - usage < 500_000  # KiB of new peak


def test_a_cache_snapshot_that_links_out_of_the_cache_is_refused(hf_dir, tmp_path):
    """A snapshot is the cache's own directory: one that is a symlink to elsewhere (a planted
    `snapshots/<commit> -> /home/user/...`) is not followed, whatever it holds."""
    repo = tmp_path / "models--org--tiny"
    (repo / "snapshots").mkdir(parents=True)
    (repo / "snapshots" / ("b" * 40)).symlink_to(hf_dir)  # hf_dir is outside repo/
    rc, _, err = run_cli(interop_main, "import-hf", repo, "--out", tmp_path / "ckpt")
    assert rc == 3 and "outside the cache folder" in one_line(err), err
    assert not (tmp_path / "ckpt").exists()


def _with_tokenizer(hf_dir: Path) -> Path:
    from tokenizer_cases import write_tiny_tokenizer

    write_tiny_tokenizer(hf_dir)
    config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return hf_dir


@pytest.mark.parametrize(
    "name,content,why",
    [
        ("generation_config.json", '{"temperature": NaN, "eos_token_id": 2}', "NaN is not a JSON number"),
        ("generation_config.json", '{"top_p": Infinity}', "Infinity is not a JSON number"),
        ("tokenizer_config.json", "[" * 100_000, "not valid JSON: RecursionError"),
        ("tokenizer_config.json", '{"bos_token": ' * 5000 + "1" + "}" * 5000, "not valid JSON: RecursionError"),
        ("chat_template.jinja", None, "is 17179869184 bytes, more than the 67108864"),
        (
            "tokenizer.json",
            json.dumps({"normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Replace", "pattern": {"String": "a"}, "content": "aa"}] * 40}}),
            "refusing its normalizer",
        ),
    ],
)  # fmt: skip
def test_hostile_tokenizer_and_generation_files_are_one_line(hf_dir, tmp_path, name, content, why):
    _with_tokenizer(hf_dir)
    if content is None:
        with open(hf_dir / name, "wb") as f:
            f.truncate(16 << 30)
    else:
        (hf_dir / name).write_text(content)
    refused(hf_dir, tmp_path / "ckpt", why)
