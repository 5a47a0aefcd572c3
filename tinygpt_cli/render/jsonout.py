"""The JSON contract: one document with shape, dtype and data, plus the ids and tokens."""

from __future__ import annotations

import functools
import json
import math
import re
import sys

import numpy as np


def jsonable(value):
    """Arrays to nested lists; NaN and ±inf (masked scores) to null, which JSON can carry."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            obj = value.astype(object)
            obj[~np.isfinite(value)] = None
            return obj.tolist()
        return value.tolist()
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def document(path: str | None, value, ids=None, tokens=None, **extra) -> dict:
    arr = np.asarray(value)
    doc: dict = {}
    if path is not None:
        doc["path"] = path
    doc["shape"] = list(arr.shape)
    doc["dtype"] = str(arr.dtype) if arr.dtype.kind != "U" else "str"
    doc["data"] = value if isinstance(value, str) else arr
    if ids is not None:
        doc["ids"] = [int(i) for i in ids]
    if tokens is not None:
        doc["tokens"] = list(tokens)
    clash = set(doc) & set(extra)
    if clash:  # a field named like the document's own would replace it without a word
        raise ValueError(f"document fields {sorted(clash)} are the document's own")
    doc.update(extra)
    return jsonable(doc)


# json.dumps(ensure_ascii=False) escapes only U+0000-U+001F; DEL and the C1 controls
# (U+0080-U+009F, among them U+009B, a one-byte CSI to many terminals) would go out raw.
_C1 = re.compile("[\x7f-\x9f]")


def dumps(doc: dict, *, ascii_only: bool = False) -> str:
    """Strict JSON (no NaN) with every control character escaped (`\\u001b`, `\\u009b`), so
    `cat`-ing it to a terminal is safe; ascii_only for streams that cannot carry UTF-8."""
    text = json.dumps(doc, ensure_ascii=ascii_only, allow_nan=False)
    if text.isascii() and "\x7f" not in text:  # nothing to escape: two scans in C, not a
        return text  # regex over every character (probs --json: 4,096 numbers a document)
    return _C1.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


class Rows:
    """A long list of a document (a million ids, their tokens, their offsets) that `emit`
    writes out a piece at a time, each item as `item(x)` for x of `source`, instead of
    building the whole list and the whole text in memory. The bytes are the same."""

    PIECE = 16_384  # items made and written at a time

    def __init__(self, source, item=None):
        self.source, self.item = source, item

    def pieces(self):
        for start in range(0, len(self.source), self.PIECE):
            part = self.source[start : start + self.PIECE]
            yield list(part) if self.item is None else [self.item(x) for x in part]


def emit(doc: dict, *, stream=None) -> None:
    """One JSON document (or one NDJSON line) on stdout, flushed so pipes see it at once;
    the fields that are Rows are written a piece at a time."""
    out = stream or sys.stdout
    encoding = (getattr(out, "encoding", None) or "utf-8").lower().replace("-", "")
    ascii_only = not encoding.startswith("utf")
    if not any(isinstance(v, Rows) for v in doc.values()):
        out.write(dumps(doc, ascii_only=ascii_only) + "\n")
    else:
        _write_with_rows(out, doc, ascii_only)
    out.flush()


def _write_with_rows(out, doc: dict, ascii_only: bool) -> None:
    """dumps(doc) with each Rows field's list written piece by piece: `"key": [` then each
    piece's items as dumps writes them inside a list, joined by ", ", then `]`."""
    head = "{"
    for key, value in doc.items():
        if not isinstance(value, Rows):
            head += dumps({key: value}, ascii_only=ascii_only)[1:-1] + ", "
            continue
        out.write(head + dumps({key: []}, ascii_only=ascii_only)[1:-2])
        first = True
        for piece in value.pieces():
            if piece:
                out.write(("" if first else ", ") + dumps(piece, ascii_only=ascii_only)[1:-1])
                first = False
        head = "], "
    out.write(head.removesuffix(", ") + "}\n")


@functools.lru_cache(maxsize=2)  # one tokenizer per run, even with --each-line
def token_json(tok) -> list[str]:
    """Every token string of the vocabulary, JSON-encoded once (token_records' strings)."""
    return [json.dumps(t, ensure_ascii=False) for t in tok.token_strs]


def token_records(out, i: int, s, token_json: list[str], stream: bool, offset: int) -> None:
    """score --json: one NDJSON line per token of TokenScores `s` (text `i`), formatted
    directly (json.dumps per record is most of the time of a --json run over a whole file);
    the token strings come JSON-encoded already; s.first: where in text i `s` starts."""
    head = "{" if stream else f'{{"text_index": {i}, "sequence": {i}, '
    start = s.first + 1 - offset
    lines = [f'{head}"position": {j + start}, "id": {t}, "token": {token_json[t]}, '
             f'"nats": {n!r}, "bits": {b!r}, "chance": {p!r}, "prob": {p!r}, "rank": {r}, '
             f'"entropy": {e!r}}}'
             for j, (t, n, b, p, r, e) in enumerate(zip(
                 s.targets.tolist(), s.nats.tolist(), s.bits.tolist(), s.prob.tolist(),
                 s.rank.tolist(), s.entropy.tolist(), strict=True))]
    if lines:
        out.write("\n".join(lines) + "\n")
        out.flush()


def emit_record(number: int, line: str, docs: list[str]) -> None:
    """--each-line's record of one line, {"line": N, "text": ..., "result": the command's
    document(s)}, on one line of stdout. The documents are spliced in as the command printed
    them (strict, escaped JSON already): parsing and printing them again took as long as the
    command itself."""
    out = sys.stdout
    encoding = (getattr(out, "encoding", None) or "utf-8").lower().replace("-", "")
    if not encoding.startswith("utf"):  # the documents must be made ASCII: print them anew
        parsed = [json.loads(d) for d in docs]
        emit({"line": number, "text": line, "result": parsed[0] if len(parsed) == 1 else parsed})
        return
    result = docs[0] if len(docs) == 1 else "[" + ", ".join(docs) + "]"
    head = dumps({"line": number, "text": line})
    out.write(f'{head[:-1]}, "result": {result}}}\n')
    out.flush()


# ------------------------------------------------------------------ --each-line --mean

# Numbers that name something (a token, a position) rather than measure it: never averaged,
# kept only where every line has the same one.
NAMES = frozenset({"ids", "id", "top_ids", "position", "shape", "line"})
_LEFT_OUT = object()


def mean_document(command: str, docs: list[dict]) -> dict:
    """--each-line --mean: the lines' documents as one, {"path": "mean", "command", "lines":
    how many were averaged, "mean": the documents' common structure with every measured
    number the mean over the lines, "std": their standard deviation (population, the same
    structure, measured numbers only), "not_averaged": the fields whose structure or names
    differ from line to line (a value per position of texts of other lengths, the tokens)}.
    A value every line has the same (labels, options, the path) is kept as it is."""
    left_out: list[str] = []
    mean, std = _mean(docs, "", left_out, named=False)
    return {"path": "mean", "command": command, "lines": len(docs), "mean": mean,
            "std": _pruned(std), "not_averaged": left_out}


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _mean(values: list, where: str, left_out: list[str], named: bool):
    """(mean, std) of one field over the lines; std None where nothing was averaged."""
    first = values[0]
    if isinstance(first, dict) and all(isinstance(v, dict) for v in values):
        values = [_in_first_order(v, first) for v in values]
        first = values[0]
        mean, std = {}, {}
        for k in first:
            at = f"{where}.{k}" if where else k
            if not all(k in v for v in values):
                left_out.append(at)
                continue
            m, s = _mean([v[k] for v in values], at, left_out, named or k in NAMES)
            if m is not _LEFT_OUT:
                mean[k], std[k] = m, s
        return (mean, std) if mean or not first else (_LEFT_OUT, None)
    if all(v == first for v in values):
        return first, None  # the same on every line: kept, nothing averaged
    if named:
        left_out.append(where)
        return _LEFT_OUT, None
    if isinstance(first, list) and all(isinstance(v, list) and len(v) == len(first)
                                       for v in values):
        if not _same_names(values):
            left_out.append(where)  # rows of other things on each line: nothing to average
            return _LEFT_OUT, None
        inner: list[str] = []
        pairs = [_mean([v[i] for v in values], f"{where}[*]", inner, named)
                 for i in range(len(values[0]))]
        if any(m is _LEFT_OUT for m, _ in pairs) and not all(isinstance(x, dict) for x in
                                                              values[0]):
            left_out.append(where)  # a list of numbers is kept whole or not at all
            return _LEFT_OUT, None
        left_out += [w for w in dict.fromkeys(inner) if w not in left_out]
        return [m for m, _ in pairs], [s for _, s in pairs]
    if all(_is_number(v) for v in values):
        a = np.asarray(values, dtype=np.float64)
        return float(a.mean()), float(a.std())
    left_out.append(where)
    return _LEFT_OUT, None


ROW_KEYS = ("component", "label", "name")  # what a row of a list of dicts is about


def _in_first_order(doc: dict, first: dict) -> dict:
    """`doc` with its rows in the order of `first`'s, where a list of rows names what each
    is about (ablate --all's components, sorted by effect on each line): that list and every
    list of the same length beside it (the rows of `data`) put in the first line's order.
    Unchanged when the rows are not the same set of things (they are then not averaged)."""
    for k, rows in first.items():
        theirs = doc.get(k)
        if not (isinstance(rows, list) and rows and isinstance(theirs, list)
                and len(theirs) == len(rows)
                and all(isinstance(r, dict) for r in [*rows, *theirs])):
            continue
        key = next((c for c in ROW_KEYS if all(c in r for r in [*rows, *theirs])), None)
        if key is None:
            continue
        where = {str(r[key]): i for i, r in enumerate(theirs)}
        order = [where.get(str(r[key])) for r in rows]
        if None in order or len(where) != len(rows) or order == list(range(len(rows))):
            continue
        return {name: [v[i] for i in order] if isinstance(v, list) and len(v) == len(rows)
                else v for name, v in doc.items()}
    return doc


def _same_names(values: list[list]) -> bool:
    """Do rows at one place name the same thing on every line (their strings and ids)?"""
    for i, row in enumerate(values[0]):
        if isinstance(row, dict):
            for k, x in row.items():
                if (isinstance(x, str) or k in NAMES) and any(v[i].get(k) != x
                                                               for v in values):
                    return False
    return True


def _pruned(std):
    """The std tree without the fields that were not averaged."""
    if isinstance(std, dict):
        out = {k: _pruned(v) for k, v in std.items()}
        return {k: v for k, v in out.items() if v is not None} or None
    if isinstance(std, list):
        out = [_pruned(v) for v in std]
        return out if any(v is not None for v in out) else None
    return std
