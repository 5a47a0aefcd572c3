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


def emit(doc: dict, *, stream=None) -> None:
    """One JSON document (or one NDJSON line) on stdout, flushed so pipes see it at once."""
    out = stream or sys.stdout
    encoding = (getattr(out, "encoding", None) or "utf-8").lower().replace("-", "")
    out.write(dumps(doc, ascii_only=not encoding.startswith("utf")) + "\n")
    out.flush()


@functools.lru_cache(maxsize=2)  # one tokenizer per run, even with --each-line
def token_json(tok) -> list[str]:
    """Every token string of the vocabulary, JSON-encoded once (token_records' strings)."""
    return [json.dumps(t, ensure_ascii=False) for t in tok.token_strs]


def token_records(out, i: int, s, token_json: list[str], stream: bool, offset: int) -> None:
    """score --json: one NDJSON line per token of TokenScores `s` (text `i`), formatted
    directly (json.dumps per record is most of the time of a --json run over a whole file);
    the token strings come JSON-encoded already."""
    head = "{" if stream else f'{{"sequence": {i}, '
    lines = [f'{head}"position": {j + 1 - offset}, "id": {t}, "token": {token_json[t]}, '
             f'"nats": {n!r}, "bits": {b!r}, "prob": {p!r}, "rank": {r}, "entropy": {e!r}}}'
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
