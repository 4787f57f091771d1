"""Data pipeline: tokenize text into shards, view them as windows, and feed exact, resumable batches.

The global sample order is a pure function of (data_seed, global batch index), so the loader's
whole state is one integer and resuming is O(1) and independent of the data-parallel size.
"""

from truestep.data.build import build_loader
from truestep.data.dataset import TokenDataset
from truestep.data.demo import default_demo_dir, demo_corpus_files, ensure_demo_data
from truestep.data.errors import DataError
from truestep.data.loader import BatchLoader
from truestep.data.meta import dtype_for_vocab, read_meta, verify_data_dir
from truestep.data.sampler import GlobalSampler
from truestep.data.shards import prepare_data
from truestep.data.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

__all__ = [
    "BatchLoader",
    "ByteTokenizer",
    "DataError",
    "GlobalSampler",
    "HFTokenizer",
    "TokenDataset",
    "build_loader",
    "default_demo_dir",
    "demo_corpus_files",
    "dtype_for_vocab",
    "ensure_demo_data",
    "load_tokenizer",
    "prepare_data",
    "read_meta",
    "verify_data_dir",
]
