"""Mixtures in process: proportions, bitwise state restore, dp-independent global order, refusals, config."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from truestep.config.errors import ConfigError
from truestep.config.fingerprint import diff_keys, trajectory_keys
from truestep.config.load import load_config, to_toml
from truestep.data import BatchLoader, DataError, GlobalSampler, TokenDataset, prepare_data
from truestep.data.mixture import Interleave, MixtureLoader, quotas

SEQ, G = 16, 8


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three byte-tokenized sources whose samples are told apart by their letters."""
    root = tmp_path_factory.mktemp("mixture")
    out = []
    for name, text in (("web", "w" * 2000), ("code", "c" * 1500 + "x" * 700), ("books", "b" * 3000)):
        source = root / f"{name}.txt"
        source.write_text(text)
        out.append(prepare_data([source], root / name, shard_tokens=333))
    return out


def loader(dirs: list[Path], weights: list[float], dp_rank: int = 0, dp: int = 1, **kw) -> MixtureLoader:
    sources = [(d.name, w, d) for d, w in zip(dirs, weights, strict=False)]
    return MixtureLoader(sources, SEQ, G, 7, dp_rank, dp, G // dp, **kw)


def global_batch(loaders: list[MixtureLoader]) -> np.ndarray:
    """The inputs of one global batch, rank slices concatenated in rank order."""
    return np.concatenate([mb[0].numpy() for ld in loaders for mb in ld.next()])


def test_proportions_hold_at_every_prefix() -> None:
    """Stated tolerance: after n samples every source has been drawn within (number of sources) of n * w."""
    rng = random.Random(0)
    cases = [[0.7, 0.3], [0.5, 0.3, 0.2], [1, 1, 1], [0.05, 0.9, 0.05], [0.123, 0.456, 0.789, 0.01]]
    cases += [[rng.uniform(0.01, 1) for _ in range(rng.randint(2, 5))] for _ in range(20)]
    for weights in cases:
        q = quotas(weights)
        shares = [w / sum(weights) for w in weights]
        assert all(abs(a / sum(q) - b) < 1e-3 for a, b in zip(q, shares, strict=True)), (weights, q)
        inter = Interleave(q)
        picks = inter.take(5000)
        counts = np.zeros(len(q))
        for n, s in enumerate(picks, start=1):
            counts[s] += 1
            assert np.all(np.abs(counts - n * np.array(q) / sum(q)) <= len(q)), (weights, n, counts)
        assert inter.drawn == counts.astype(int).tolist()


def test_mixture_draws_each_source_by_weight_and_logs_its_tokens(dirs: list[Path]) -> None:
    ld = loader(dirs, [0.5, 0.3, 0.2])
    seen = {"w": 0, "c": 0, "b": 0}
    for _ in range(100):
        for inputs, _ in ld.next():
            for row in inputs.numpy():
                letter = chr(int(row[0]))
                seen["c" if letter == "x" else letter] += 1
    assert seen == {"w": 400, "c": 240, "b": 160}  # 800 samples, quotas 5:3:2 exactly over full periods
    assert ld.tokens_per_source() == {"web": 400 * SEQ, "code": 240 * SEQ, "books": 160 * SEQ}


def test_first_source_alone_is_the_single_corpus_order(dirs: list[Path]) -> None:
    mix = loader(dirs[:1], [1.0])
    ds = TokenDataset(dirs[0], SEQ)
    single = BatchLoader(ds, GlobalSampler(len(ds), G, 7), 0, 1, G)
    for _ in range(30):  # several epochs of the 124-sample source
        assert np.array_equal(global_batch([mix]), single.next()[0][0].numpy())


def test_restore_is_bitwise_and_dp_2_to_1_keeps_the_global_order(dirs: list[Path]) -> None:
    weights = [0.6, 0.25, 0.15]
    reference = loader(dirs, weights)
    expected = [global_batch([reference]) for _ in range(40)]

    ranks = [loader(dirs, weights, r, 2) for r in range(2)]
    got = [global_batch(ranks) for _ in range(17)]
    saved = json.loads(json.dumps(ranks[0].state_dict()))  # through JSON, as in a rank-state file
    assert saved == ranks[1].state_dict()  # every rank holds the same global state
    resumed = loader(dirs, weights)  # dp 2 -> 1
    resumed.load_state_dict(saved)
    got += [global_batch([resumed]) for _ in range(23)]
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert resumed.state_dict() == reference.state_dict()

    back = [loader(dirs, weights, r, 4) for r in range(4)]  # and 1 -> 4
    for ld in back:
        ld.load_state_dict(json.loads(json.dumps(loader(dirs, weights).state_dict())))
    assert np.array_equal(global_batch(back), expected[0])


def test_changed_mixture_is_refused_naming_the_change_unless_allowed(dirs: list[Path]) -> None:
    old = loader(dirs, [0.5, 0.5, 0.0001])
    for _ in range(5):
        old.next()
    state = old.state_dict()
    with pytest.raises(DataError, match=r"source books weight: 0.0001 -> 0.2"):
        loader(dirs, [0.5, 0.5, 0.2]).load_state_dict(state)
    with pytest.raises(DataError, match=r"source books removed"):
        loader(dirs[:2], [0.5, 0.5]).load_state_dict(state)
    adopted = loader(dirs[:2], [0.3, 0.7], allow_change=True)
    adopted.load_state_dict(state)
    assert adopted.next_batch == 5
    assert adopted.interleave.drawn == [state["sources"][0]["drawn"], state["sources"][1]["drawn"]]
    assert adopted.interleave.credit == [0, 0]
    with pytest.raises(DataError, match="single corpus"):
        loader(dirs, [1, 1, 1]).load_state_dict({"next_batch": 3, "data_seed": 7})


def test_re_prepared_source_is_refused(dirs: list[Path], tmp_path: Path) -> None:
    state = loader(dirs[:1], [1.0]).state_dict()
    state["sources"][0]["content"] = "0" * 16
    with pytest.raises(DataError, match=r"source web tokens \(re-prepared\)"):
        loader(dirs[:1], [1.0]).load_state_dict(state)


def test_sources_of_different_tokenizers_are_refused(dirs: list[Path], tmp_path: Path) -> None:
    from test_data import train_hf_tokenizer

    tok = train_hf_tokenizer(tmp_path / "tokenizer.json")
    text = tmp_path / "t.txt"
    text.write_text("the cat sat " * 200)
    other = prepare_data([text], tmp_path / "hf", str(tok))
    with pytest.raises(DataError, match="different tokenizers"):
        loader([dirs[0], other], [1, 1])


def test_sources_config_toml_override_and_fingerprint(tmp_path: Path) -> None:
    mix = '[{path="data/web", weight=0.7}, {path="data/code", weight=0.3}]'
    cfg = load_config("tiny", [f"--data.sources={mix}"])
    assert [(s.path, s.weight) for s in cfg.data.sources] == [("data/web", 0.7), ("data/code", 0.3)]
    path = tmp_path / "c.toml"
    path.write_text(to_toml(cfg))
    assert load_config(str(path)).data.sources == cfg.data.sources
    changed = load_config("tiny", ['--data.sources=[{path="data/web", weight=0.6}, {path="data/books"}]'])
    assert diff_keys(trajectory_keys(cfg), trajectory_keys(changed)) == [
        "data.sources[0].weight: 0.7 -> 0.6",
        "data.sources[1].path: 'data/code' -> 'data/books'",
        "data.sources[1].weight: 0.3 -> 1.0",
    ]
    for bad, message in [
        ('[{path="a", weight=0}]', "weight must be a positive"),
        ('[{path="a"}, {path="a"}]', "more than once"),
        ('[{path=""}]', "must name a prepared data directory"),
        ('[{path="a", wieght=1}]', "unknown key data.sources"),
        ('{path="a"}', "array of tables"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config("tiny", [f"--data.sources={bad}"])
    with pytest.raises(ConfigError, match="not both"):
        load_config("tiny", ["--data.path=x", '--data.sources=[{path="a"}]'])
