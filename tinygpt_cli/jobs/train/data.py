"""The training text now lives in `tinygpt_cli.storage.corpus` (shared by train, why, neurons, means
and score); these names stay importable from here for training code and older scripts."""

from ...storage.corpus import (  # noqa: F401
    TokenStream,
    TrainingDataError,
    encode_stories,
    eval_windows,
    random_windows,
    read_stories,
    read_text_file,
    split_data,
)
