"""score's work around its analysis: what is scored (a text, a file's stories, or the
held-out stream the weights record, after checking the options), and where the batches are
scored (this process, or a cluster's workers: analysis.score scores them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import numpy as np

from ..analysis.score import TokenScores, batch_scores
from ..errors import InputError
from ..transformer.windows import encode_stories
from .cluster import in_turn
from .corpus import ends_with_separator, read_data_record, stories_of, validation_text

BATCHES_PER_TASK = 16  # on a cluster: 128 windows a task


def scored_on(engine) -> Callable | None:
    """score_parts' `scored` for a cluster (`engine`): the batches its tasks, BATCHES_PER_TASK
    a task (their windows sent as int32), the scores taken in order as they come; None
    (score here, each batch as it is needed) without one. The passes --each-line makes ahead
    stay in this process: the workers run their own."""

    if engine is None:
        return None

    def scored(batches: Iterable[tuple], shared: tuple) -> Iterator[tuple[list, TokenScores]]:
        params, config, hooks, _ = shared
        chunks, tasks = [], []
        for chunk, (x, rows, cols, targets) in batches:
            if not tasks or len(tasks[-1]) == BATCHES_PER_TASK:
                chunks.append([])
                tasks.append([])
            chunks[-1].append(chunk)
            tasks[-1].append((x.astype(np.int32), rows, cols, targets))
        with engine.job((params, config, hooks, None)) as run:
            for i, found in in_turn(run(batch_scores, tasks)):
                yield from zip(chunks[i], found, strict=True)

    return scored


class Inputs(NamedTuple):
    """What score_inputs gives analysis.score.score_texts: the id sequences, how many ids
    were put before each text (the separator), the stream's bytes per token (--stream), and
    how many closing separators are scored that the file does not hold (its last story's, 0
    or 1)."""

    sequences: list[np.ndarray]
    offset: int
    stream_bpt: float | None
    added: int = 0


def score_inputs(model, text: str | None, read_text: Callable[[str | None], str], file,
                 stride: int | None, stream: bool, bos: bool, closing: bool = True) -> Inputs:
    """The ids to score (Inputs), after checking the options; `read_text(text)` gives the text
    when no --file is given (called last: an option error comes before stdin is read). A
    file's stories are each closed by a separator, as the training stream has them; the last
    one's is scored only when `closing` or the file ends with one (Inputs.added says when it
    was not in the file)."""

    tok, cfg = model.tokenizer, model.config
    eot = tok.eot_id
    if stream and file is None:  # the held-out text the weights record
        if read_data_record(model.folder) is None:
            raise InputError("--stream reads a file: give it with --file (these weights "
                             "have no data.json naming their validation text)")
        file = validation_text(model.folder, None)[0]
    if stream and stride not in (None, cfg.n_positions):
        raise InputError(f"--stream uses non-overlapping windows of {cfg.n_positions} "
                         "tokens; leave out --stride")
    if stride is not None and stride > cfg.n_positions:
        raise InputError(f"--stride {stride} is longer than the {cfg.n_positions}-token "
                         "context: give 1 to " + str(cfg.n_positions))
    if file is not None and text is not None:
        raise InputError("give a text or --file, not both")
    if file is not None:
        stories = stories_of(file)
        invented = not ends_with_separator(file)  # the last story's separator
        cut, added = (int(invented and not closing), int(invented and closing))
        if not stream:
            seqs = [np.asarray([eot] + ids + [eot]) for ids in tok.encode_batch(stories)]
            seqs[-1] = seqs[-1][:len(seqs[-1]) - cut]
            if len(seqs[-1]) < 2:
                raise InputError(f"{file}'s last story is one token: with "
                                 "--no-closing-separator nothing is left to predict")
            return Inputs(seqs, 1, None, added)
        ts = encode_stories(stories, tok)
        ids, n_bytes = ts.ids[:len(ts.ids) - cut], ts.n_bytes - cut  # a separator is a byte
        if len(ids) <= cfg.n_positions:
            raise InputError(f"--stream needs more than {cfg.n_positions} tokens; "
                             f"{file} has {len(ids)}")
        # whole windows only: the last token is scored when the last window ends on it
        scored = (len(ids) - 1) % cfg.n_positions == 0
        return Inputs([ids.astype(np.int64)], 0, n_bytes / len(ids), added * scored)
    # before a text: the tokens the folder's tokenizer puts there (Gemma's <bos>), else eot
    before = (list(tok.affix[0]) or [eot]) if bos else []
    seq = np.asarray(before + tok.encode(read_text(text)))
    if len(seq) < 2:
        raise InputError("one token alone has nothing before it to predict it from; "
                         "give a longer text or leave out --no-bos")
    return Inputs([seq], len(before), None)
