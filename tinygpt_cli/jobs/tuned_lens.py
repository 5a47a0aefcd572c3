"""The passes over a corpus that fit and evaluate the tuned lens (analysis/tuned_lens.py):
the stages' values of the training text (sharded on the engine), the fit saved to its file
(jobs/dictionaries/lens.py), both lenses on held-out text, and the reader `lens --kind tuned`
hands lens_report."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from ..analysis.lens import Lens
from ..analysis.tuned_lens import evaluate_windows, fit, stage_values, tuned_stage_logits
from ..storage.madefor import made_for
from .cluster import over_windows
from .corpus import data_windows, given_or, held_out_files, training_files
from .dictionaries.lens import lens_file, load_translators, save_translators

FIT_WINDOWS = 200  # 25,600 training tokens
EVAL_WINDOWS = 40  # 5,120 held-out tokens
FIT_STEPS = 300  # Adam steps per stage, 512 tokens each


def tuned_reader(session, given: Path | None):
    """trace -> the tuned lens of the session's text as a Lens (stages, logits), the model's
    logits last: lens_report's reader."""

    def read(trace):
        path = lens_file(session.model.weights_file, given)
        translators = load_translators(path, session.config, session.model.weights_file)
        return Lens(*tuned_stage_logits(trace, translators, session.params, session.config))

    return read


def fit_and_save(model, windows: np.ndarray, path: Path, bar, hooks=None,
                 meta: dict | None = None, engine=None) -> int:
    """Fit the translators on the windows' stages (of runs through `hooks`, when given, on
    `engine`) and write them to `path` with `meta` added to their metadata; the tokens used.
    bar(total, description) is the progress bar's context manager."""

    cfg = model.config
    with bar(len(windows), "values of the stages") as advance:
        stages, last = stage_values(model.params, cfg, windows, progress=advance, hooks=hooks,
                                    over=partial(over_windows, engine))
    with bar(FIT_STEPS * cfg.n_layer, "fitting the tuned lens") as advance:
        translators, _ = fit(stages, last, model.params, cfg, steps=FIT_STEPS, progress=advance)
    save_translators(path, translators, {**made_for(model.weights_file),
                                         "tokens": str(len(last)), "steps": str(FIT_STEPS),
                                         **(meta or {})})
    return len(last)


def fit_on_training_text(model, data, path, bar, hooks=None, changes=None, engine=None) -> int:
    """`lens --fit`: translators fitted on FIT_WINDOWS windows of the training text (--data's
    parts but the last, or the project's) and saved to `path`; the number of tokens."""

    x, _ = data_windows(training_files(data), model.tokenizer, model.config.n_positions,
                        FIT_WINDOWS, bar)
    return fit_and_save(model, x, path, bar, hooks, changes, engine)


def evaluate_held_out(model, data, translators, bar, hooks=None, engine=None):
    """`lens --evaluate`: both lenses over EVAL_WINDOWS windows of the held-out text (--data's
    last part, or part-005); (the LensEval, the files' names)."""

    files = given_or(data, held_out_files)
    x, _ = data_windows(files, model.tokenizer, model.config.n_positions, EVAL_WINDOWS, bar)
    with bar(2 * x.size, "evaluating both lenses") as advance:
        result = evaluate_windows(model.params, model.config, x, translators, advance, hooks,
                                  partial(over_windows, engine))
    return result, [f.name for f in files]
