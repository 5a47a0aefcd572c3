"""Linear probes with a control task (Hewitt and Liang 2019).

A probe is a multinomial logistic regression from the value at a site (a row of
`layers.1.resid_post`, say) to a label of that token, fitted by Newton's method in float64:

    minimise  mean_n CE(softmax(W x_n + b), y_n) + (l2 / 2) ||W||^2     (b not penalised)

Its held-out accuracy alone says little: a probe can learn the labels from the token's
identity. The control task gives every token *type* a random label (drawn once per type from
the labels' own frequencies) and fits the same probe to it; selectivity = accuracy - control
accuracy is what the site knows beyond the token it is at. Lines (stories) are split into
train and held-out, never tokens, so no text is seen on both sides.

Labels files (`parse_labels`):
- text: one text a line; `[label]` right after a token labels the token that ends there
  (`Lily[name] ran to Tom[name].`): the marks are removed, the rest is the text. A label is
  1-40 characters other than spaces and brackets. Unmarked tokens take `default` when given,
  else they are left out. A word of several tokens is labelled at its last token.
- JSON lines: {"text": "...", "labels": [...]}, one label (a string or number, or null to
  leave the token out) per token of the text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..transformer.config import Config
from ..transformer.hooks import Chain, RecordOnly, StopAfter
from ..transformer.model import forward
from ..transformer.sampling import create_rng
from ..transformer.schema import resolve
from ..transformer.wiring import FORWARD

# The blocks this analysis implements (wiring.require refuses others by name): recorded values read.
HANDLES = FORWARD

MARK = re.compile(r"\[([^\[\]\s]{1,40})\]")


# ------------------------------------------------------------------ the labels file


@dataclass
class Line:
    text: str
    marks: list[tuple[int, str]] | None  # (UTF-8 byte offset the token ends at, label)
    labels: list[str | None] | None  # or one label per token (JSON lines)


def parse_labels(content: str, name: str = "--labels") -> list[Line]:
    lines = []
    for n, raw in enumerate(content.splitlines(), 1):
        if not raw.strip():
            continue
        lines.append(_json_line(raw, n, name) if raw.lstrip().startswith("{") else
                     _marked_line(raw, n, name))
    if not lines:
        raise InputError(f"{name} holds no text")
    return lines


def _marked_line(raw: str, n: int, name: str) -> Line:
    text, marks, end = "", [], 0
    for m in MARK.finditer(raw):
        text += raw[end:m.start()]
        end = m.end()
        if not text or text[-1].isspace():
            raise InputError(f"{name} line {n}: the mark [{m.group(1)}] follows "
                             f"{'a space' if text else 'nothing'}; put it right after the "
                             "token it labels (Tom[name])")
        marks.append((len(text.encode("utf-8")), m.group(1)))
    text += raw[end:]
    if not text.strip():
        raise InputError(f"{name} line {n}: no text besides the marks")
    return Line(text, marks, None)


def _json_line(raw: str, n: int, name: str) -> Line:
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InputError(f"{name} line {n}: not valid JSON ({e.msg})") from None
    text, labels = (doc.get("text"), doc.get("labels")) if isinstance(doc, dict) else (0, 0)
    if not isinstance(text, str) or not text or not isinstance(labels, list) or not all(
            x is None or isinstance(x, str | int) and not isinstance(x, bool) for x in labels):
        raise InputError(f'{name} line {n}: a JSON line must be {{"text": "...", "labels": '
                         '[...]}} with a label (text, number or null) per token')
    return Line(text, None, [None if x is None else str(x) for x in labels])


def token_labels(line: Line, offsets: list[tuple[int, int]], default: str | None,
                 n: int, name: str = "--labels") -> list[str | None]:
    """One label (or None) per token of the line, from its marks or its JSON labels."""
    if line.labels is not None:
        if len(line.labels) != len(offsets):
            raise InputError(f"{name} line {n}: {len(line.labels)} labels for "
                             f"{len(offsets)} tokens")
        return list(line.labels)
    ends = {end: i for i, (_, end) in enumerate(offsets)}
    labels: list[str | None] = [default] * len(offsets)
    for at, label in line.marks:
        if at not in ends:
            raise InputError(f"{name} line {n}: the mark [{label}] is not right after a "
                             "token (it follows a space, another mark or the middle of "
                             "a token)")
        labels[ends[at]] = label
    return labels


# ------------------------------------------------------------------ features


def site_values(params, config: Config, ids: list[int], site: str, hooks=None) -> np.ndarray:
    """The value at `site` for one text (a run through `hooks`, steering, when given),
    [T, d] in float64."""
    keep = RecordOnly({site})
    forward(params, config, np.asarray(ids), hooks=Chain(hooks, keep, StopAfter(site)))
    return keep.values[site].astype(np.float64)


# ------------------------------------------------------------------ the fit


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def probe_loss(W, b, X, y, l2: float) -> float:
    """mean cross-entropy + (l2 / 2) ||W||^2."""
    z = X @ W.T + b
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return float(-logp[np.arange(len(y)), y].mean() + 0.5 * l2 * (W * W).sum())


def _gradient_and_hessian(theta, X1, Y, l2, C):
    """theta = [W | b] as [C, d + 1]; X1 = [X | 1]; the flattened gradient and Hessian."""
    n, d1 = X1.shape
    P = softmax(X1 @ theta.T)  # [N, C]
    reg = np.full(d1, l2)
    reg[-1] = 0.0  # the bias is not penalised
    grad = (P - Y).T @ X1 / n + theta * reg
    H = np.empty((C, d1, C, d1))
    for c in range(C):
        for k in range(c, C):
            w = P[:, c] * ((c == k) - P[:, k]) / n
            H[c, :, k, :] = H[k, :, c, :] = (X1 * w[:, None]).T @ X1
        H[c, :, c, :] += np.diag(reg)
    return grad.ravel(), H.reshape(C * d1, C * d1)


def fit_probe(X: np.ndarray, y: np.ndarray, n_classes: int, l2: float = 1e-3,
              max_steps: int = 100, tol: float = 1e-10) -> tuple[np.ndarray, np.ndarray, int]:
    """(W [C, d], b [C], Newton steps) minimising probe_loss, from zero.

    The loss does not change when the same number is added to every b_c, so the Hessian is
    singular along that direction; the least-squares Newton step never moves along it, which
    keeps sum(b) = 0 (as gradient methods started at zero do too). Backtracking halves a step
    that would raise the loss."""
    X = np.asarray(X, np.float64)
    X1 = np.hstack([X, np.ones((len(X), 1))])
    Y = np.eye(n_classes)[y]
    theta = np.zeros((n_classes, X.shape[1] + 1))

    def loss(t):
        return probe_loss(t[:, :-1], t[:, -1], X, y, l2)

    current, steps = loss(theta), 0
    while steps < max_steps:
        steps += 1
        grad, H = _gradient_and_hessian(theta, X1, Y, l2, n_classes)
        step = np.linalg.lstsq(H, grad, rcond=None)[0].reshape(theta.shape)
        t = 1.0
        while t > 1e-8 and loss(theta - t * step) > current + 1e-15:
            t /= 2
        theta = theta - t * step
        current = loss(theta)
        if np.abs(t * step).max() < tol:
            break
    return theta[:, :-1], theta[:, -1], steps


def accuracy(W, b, X, y) -> float:
    return float(np.mean(np.argmax(X @ W.T + b, axis=-1) == y)) if len(y) else float("nan")


# ------------------------------------------------------------------ the control task


def control_labels(types: np.ndarray, y: np.ndarray, n_classes: int, seed: int) -> np.ndarray:
    """Each token type's one random label, drawn from the labels' own frequencies; every
    token of that type gets it (Hewitt and Liang's control task)."""
    freq = np.bincount(y, minlength=n_classes) / len(y)
    kinds = np.unique(types)
    drawn = create_rng(seed).choice(n_classes, size=len(kinds), p=freq)
    return drawn[np.searchsorted(kinds, types)]


def split_lines(n: int, held_out: float, seed: int) -> np.ndarray:
    """A bool per line: True for the held-out ones (a seeded shuffle, at least one each)."""
    if n < 2:
        raise InputError(f"probe needs at least 2 labelled lines (to fit and to test); the "
                         f"file has {n}")
    k = min(max(1, round(held_out * n)), n - 1)
    held = np.zeros(n, bool)
    held[create_rng(seed).permutation(n)[:k]] = True
    return held


@dataclass
class ProbeReport:
    site: str
    classes: list[str]
    W: np.ndarray  # [C, d]
    b: np.ndarray  # [C]
    steps: int
    l2: float
    train_counts: np.ndarray  # [C] tokens per class
    held_counts: np.ndarray
    lines: tuple[int, int]  # (train, held-out) lines
    accuracy: float  # held out
    train_accuracy: float
    control_accuracy: float  # held out, the probe refitted on the control labels
    control_train_accuracy: float
    majority: float  # held-out accuracy of always the commonest training label

    @property
    def selectivity(self) -> float:
        return self.accuracy - self.control_accuracy

    @property
    def direction(self) -> np.ndarray:
        """W[1] - W[0] for two labels (toward the second); else the first row."""
        return self.W[1] - self.W[0] if len(self.classes) == 2 else self.W[0]


def probe_report(features: list[np.ndarray], labels: list[list[str | None]],
                 types: list[list[int]], site: str, *, held_out: float = 0.25,
                 seed: int = 0, l2: float = 1e-3) -> ProbeReport:
    """Fit the probe and its control on the training lines; score both on the others.

    features[i] [T_i, d], labels[i] and types[i] (token ids) per token of line i."""
    held_line = split_lines(len(features), held_out, seed)
    keep = [np.array([x is not None for x in lab], bool) for lab in labels]
    X = np.concatenate([f[k] for f, k in zip(features, keep, strict=True)])
    names = [x for lab in labels for x in lab if x is not None]
    classes = sorted(set(names))
    if len(classes) < 2:
        raise InputError(f"the labels file has {len(classes)} label; a probe needs at least 2")
    y = np.searchsorted(classes, names)
    tok = np.concatenate([np.asarray(t)[k] for t, k in zip(types, keep, strict=True)])
    held = np.concatenate([np.full(k.sum(), h) for k, h in zip(keep, held_line, strict=True)])
    if not held.any() or held.all():
        raise InputError("after the split one side has no labelled token; give more lines "
                         "or change --held-out")
    C, tr = len(classes), ~held
    W, b, steps = fit_probe(X[tr], y[tr], C, l2)
    yc = control_labels(tok, y, C, seed)
    Wc, bc, _ = fit_probe(X[tr], yc[tr], C, l2)
    common = np.argmax(np.bincount(y[tr], minlength=C))
    return ProbeReport(site, classes, W, b, steps, l2, np.bincount(y[tr], minlength=C),
                       np.bincount(y[held], minlength=C),
                       (int((~held_line).sum()), int(held_line.sum())),
                       accuracy(W, b, X[held], y[held]), accuracy(W, b, X[tr], y[tr]),
                       accuracy(Wc, bc, X[held], yc[held]), accuracy(Wc, bc, X[tr], yc[tr]),
                       float(np.mean(y[held] == common)))


# ------------------------------------------------------------------ which values can be probed


def check_site(site: str, config: Config, params) -> str:
    """The canonical path of a value with one row per token, else InputError."""

    name, rows = resolve(site, config)
    if rows or name == "ids" or not one_row_per_token(params, config, name):
        raise InputError(f"--site {site}: a probe needs a value with one row per token, "
                         "such as layers.1.resid_post, layers.0.mlp_out or "
                         "layers.0.heads.1.out")
    return name


def one_row_per_token(params, config: Config, name: str) -> bool:
    """Is the value [T, n] (shapes [2, n] and [3, n] for texts of 2 and 3 tokens)?"""
    try:
        two, three = (site_values(params, config, [0] * t, name).shape for t in (2, 3))
    except KeyError:  # not a value the forward pass computes
        return False
    return len(two) == 2 and two == (2, three[1]) and three[0] == 3
