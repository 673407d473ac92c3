"""Loaders read the official layouts from disk and refuse a missing path by naming the files."""

import pickle

import numpy as np
import pytest
import torch

from dblp.train.data import (
    DatasetMissingError,
    WordTokenizer,
    iterate_batches,
    lm_blocks,
    load_cifar10,
    load_cifar100,
    load_digits,
    load_tiny_corpus,
    load_wikitext2,
)
from dblp.train.models import get_workload


@pytest.mark.parametrize(
    "loader, names",
    [
        (load_cifar10, ["cifar-10-batches-py", "data_batch_1", "data_batch_5", "test_batch"]),
        (load_cifar100, ["cifar-100-python", "train", "test"]),
        (load_wikitext2, ["wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens", "wiki.train.raw"]),
    ],
)
@pytest.mark.parametrize("root", ["missing", None])
def test_missing_path_is_refused_with_the_expected_files(tmp_path, loader, names, root):
    path = tmp_path / "nothing-here" if root else None
    with pytest.raises(DatasetMissingError) as exc:
        loader(path)
    msg = str(exc.value)
    for n in names:
        assert n in msg
    assert "download" in msg


def test_incomplete_cifar_folder_is_refused(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    (d / "data_batch_1").write_bytes(b"")
    with pytest.raises(DatasetMissingError, match="data_batch_2"):
        load_cifar10(tmp_path)


@pytest.mark.parametrize("name", ["efficientnet_b0", "resnet50", "alexnet", "gpt2_s"])
def test_paper_workload_without_data_names_the_files(tmp_path, monkeypatch, name):
    monkeypatch.delenv("DBLP_DATA_ROOT", raising=False)
    with pytest.raises(DatasetMissingError, match="cifar|wiki"):
        get_workload(name, tmp_path)


def _write_cifar(root, name, files, label_key, n=4):
    d = root / name
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for f in files:
        data = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), label_key: list(range(n))}
        with open(d / f, "wb") as fh:
            pickle.dump(data, fh)
    return d


def test_cifar10_pickles_are_read(tmp_path):
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    d = _write_cifar(tmp_path, "cifar-10-batches-py", files, b"labels")
    for root in (tmp_path, d):  # parent folder or the folder itself
        train, test = load_cifar10(root)
        assert train.x.shape == (20, 3, 32, 32) and train.x.dtype == torch.uint8
        assert test.y.tolist() == [0, 1, 2, 3]


def test_cifar100_pickles_are_read_with_fine_labels(tmp_path):
    _write_cifar(tmp_path, "cifar-100-python", ["train", "test"], b"fine_labels")
    train, test = load_cifar100(tmp_path)
    assert len(train) == 4 and len(test) == 4 and train.y.dtype == torch.int64


@pytest.mark.parametrize("variant, sub", [("tokens", "wikitext-2"), ("raw", "wikitext-2-raw")])
def test_wikitext2_is_read_word_and_byte_level(tmp_path, variant, sub):
    d = tmp_path / sub
    d.mkdir()
    text = " = Title = \n\n the cat sat on the mat . \n the dog sat . \n" * 20
    for split in ("train", "valid", "test"):
        (d / f"wiki.{split}.{variant}").write_text(text + (" zebra \n" if split == "test" else ""))
    train, valid, test, tok = load_wikitext2(tmp_path, seq_len=8)
    assert isinstance(tok, WordTokenizer) and tok.vocab_size == 11  # 9 distinct words + <unk> + <eos>
    assert train.x.shape[1] == 8 and torch.equal(train.x[0, 1:], train.y[0, :-1])
    assert int(test.x.max()) < tok.vocab_size  # "zebra" became <unk>
    *_, btok = load_wikitext2(d, seq_len=8, tokenizer="byte")
    assert btok.vocab_size == 256


def test_digits_and_tiny_corpus_ship_with_the_project():
    train, test = load_digits()
    assert train.x.shape[1:] == (1, 8, 8) and len(train) + len(test) == 1797
    assert 0.0 <= float(train.x.min()) and float(train.x.max()) <= 1.0
    tr, te, tok = load_tiny_corpus(seq_len=32)
    assert len(tr) > 100 and len(te) > 10 and tok.decode(tok.encode("the garden")) == "the garden"


def test_lm_blocks_and_batches():
    ds = lm_blocks(torch.arange(21), 5)
    assert len(ds) == 4 and ds.x[1].tolist() == [5, 6, 7, 8, 9] and ds.y[1].tolist() == [6, 7, 8, 9, 10]
    g = torch.Generator().manual_seed(0)
    batches = list(iterate_batches(ds, 3, generator=g))
    assert len(batches) == 1 and batches[0][0].shape == (3, 5)
    shard = ds.shard(1, 2)
    assert len(shard) == 2 and shard.x[0, 0] == 10
