"""The seed page's "Quick review", card by card: where each value lives and how it is made.

Each card names the trace path that holds its value (card 11's pick is random, not a stored
value: its formula says how it is drawn), the formula, and the command that shows it, so
`tinygpt review` and `tinygpt map` draw the page from this one list.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .ops import rotary_frequencies
from .sampling import create_rng, sample
from .wiring import FAMILIES, handles

# The blocks this analysis implements (wiring.require refuses others by name): the diagram and the
# page's formulas draw the families' two wirings, and Gemma 3's norms after each branch.
HANDLES = handles(step=FAMILIES["step"] + ("norm after attention", "norm after the MLP"))


@dataclass(frozen=True)
class Card:
    number: int
    title: str
    what: str  # one sentence, as the seed page says it
    formula: str
    path: str | None  # where the value lives in the trace; None for the random pick
    command: str  # the command that shows it
    detail: str = ""  # the page's second sentence, filled in with this model's sizes


CARDS = [
    Card(1, "Inputs", "Your text, split into tokens; each token is an id from the vocabulary.",
         "ids = tokenizer.encode(text)", "ids", "tinygpt encode TEXT",
         "The text is {T} token ids, each from 0 to {vocab_max:,}."),
    Card(2, "Embedding", "Each id picks one row from a table of learned numbers.",
         "x_i = W_E[t_i]", "token_embeddings", "tinygpt embed TEXT",
         "The table has {vocab:,} rows of {d} numbers. The text becomes {T} rows of {d}."),
    Card(3, "Position", "Each position gets its own row too, added to the token's row; that "
         "is how the model knows the order.",
         "h_i = W_E[t_i] + W_P[i]", "embeddings", "tinygpt pos TEXT --sum",
         "GPT-2 learns a table of positions: {longest} positions by {d} numbers. Row 0 goes "
         "to the first token, row 1 to the second."),
    Card(4, "Add and norm", "Norm rescales each token's numbers to a steady range, before "
         "attention and before the feed-forward layer; add keeps what came in.",
         "x + Sublayer(LayerNorm(x))", "layers.0.ln1.out", "tinygpt norm TEXT --layer 0",
         "Each token's {d} numbers are handled on their own. GPT-2 moves the norm to the "
         "start of each step."),
    Card(5, "Masked attention", "Each token looks at itself and the tokens before it and "
         "pulls in what it needs; it cannot look ahead.",
         "softmax(Q K^T / sqrt(d_k) + M) V,  M_ij = -inf when j > i",
         "layers.0.heads.0.weights", "tinygpt attn TEXT --layer 0 --head 0",
         "This model has {heads} heads with {d_k} numbers each. Each head makes a {T} by {T} "
         "grid of weights; each row sums to 1."),
    Card(6, "Feed forward", "Each token's numbers go through a small network on their own.",
         "GELU(x W_1 + b_1) W_2 + b_2", "layers.0.mlp_out", "tinygpt mlp TEXT --layer 0",
         "{d} numbers grow to {ffn}, pass through GELU, and shrink back to {d}."),
    Card(7, "Repeated blocks", "The block repeats; each one refines the numbers further.",
         "h^(l+1) = Block_l(h^(l))", "layers.length", "tinygpt blocks TEXT",
         "This model stacks {L} blocks. The paper used 6, and GPT-2 small uses 12."),
    Card(8, "Final norm", "One more norm after the last block, before the scores are made.",
         "u = LayerNorm(h^(L))", "ln_final.out", "tinygpt final-norm TEXT",
         "The {T} rows of {d} numbers, rescaled. GPT-2 added it; the paper has none."),
    Card(9, "Linear", "Turns each token's numbers into one score for every vocabulary token, "
         "reusing the embedding table.", "z = u W_E^T", "logits", "tinygpt logits TEXT",
         "{vocab:,} scores per position. Only the last position is used to guess the next "
         "token."),
    Card(10, "Softmax", "Turns the scores into chances between 0 and 1 that add up to 1.",
         "p_t = exp(z_t) / sum_s exp(z_s)", "probs[-1]",
         "tinygpt probs TEXT",
         "{vocab:,} chances, one for each possible next token."),
    Card(11, "Output", "Pick one token by its chance, add it to the text, and run again.",
         "t_{T+1} = sample(probs[-1], create_rng(1))", None, "tinygpt sample TEXT --seed 1",
         "One chance for each of the {vocab:,} tokens; the seeded pick is the next token."),
]


def cards_for(config) -> list[Card]:
    """The cards as this model's family computes them: GPT-2's are the seed page's; a rotary,
    RMSNorm, gated or untied model's cards 3, 4, 6, 8 and 9 say what it does instead (the
    same card numbers, paths that hold its values)."""

    act = {"gelu_new": "GELU", "gelu": "GELU (erf)", "silu": "SiLU"}.get(config.act,
                                                                      config.act)
    norm = "LayerNorm" if config.norm == "layer" else "RMSNorm"
    changed = {}
    if config.embed_scale:
        changed[2] = dict(formula=f"x_i = W_E[t_i] * {config.embed_scale:g}",
                          detail="The table has {vocab:,} rows of {d} numbers, each row read "
                                 f"times {config.embed_scale:g} (sqrt({{d}}) as the weights' "
                                 "dtype rounds it). The text becomes {T} rows of {d}.")
    if config.rotary:
        changed[3] = dict(
            what="Nothing is added for the position: each head turns its queries and keys by "
                 "an angle that grows with the position, so a score depends on how far apart "
                 "two tokens are.",
            formula="q_i, k_i turned by angle i * base^(-2j/r) in each pair j (rotary)",
            path="rotary_angles", command="tinygpt pos TEXT",
            detail=f"Rotary positions turn {config.rotary} of each head's {{d_k}} numbers, "
                   f"{rotary_bases(config)}; there is no table of positions.")
    if config.post_norms:
        changed[4] = dict(
            formula="x + Norm(Sublayer(Norm(x)))".replace("Norm", norm),
            path="layers.0.ln1.out",
            detail="Each token's {d} numbers are handled on their own. Four RMSNorms per "
                   "block: before attention (ln1) and after it (ln1_post), before the "
                   "feed-forward layer (ln2) and after it (ln2_post), each sublayer's output "
                   "normed before it is added. Each multiplies by 1 + w (the file keeps w).")
    elif config.norm == "rms" or config.parallel:
        changed[4] = dict(
            formula=("x + Attn(Norm(x)) + MLP(Norm(x))" if config.parallel
                     else "x + Sublayer(Norm(x))").replace("Norm", norm),
            path="layers.0.ln1.out",
            detail="Each token's {d} numbers are handled on their own. "
                   + ("RMSNorm divides by their root mean square (no mean taken out, no "
                      "bias). " if config.norm == "rms" else "")
                   + ("Attention and the feed-forward layer both read the block's input and "
                      "add to it at once." if config.parallel
                      else "The norm comes at the start of each step."))
    if config.windows and any(config.windows):
        changed[5] = dict(
            formula="softmax(Q K^T * scale + M) V,  M_ij = -inf when j > i or j <= i - w",
            detail="This model has {heads} heads with {d_k} numbers each. "
                   + windows_said(config) + " Each row of a head's {T} by {T} grid sums to 1.")
    if config.mlp == "gated" or config.act != "gelu_new":
        gated, name = config.mlp == "gated", act.split(" ")[0]
        changed[6] = dict(
            formula=(f"({name}(x W_gate) * (x W_in)) W_out" if gated
                     else f"{name}(x W_1 + b_1) W_2 + b_2"),
            detail=(f"{{d}} numbers grow to {{ffn}} twice: one through {act} gates the "
                    "other, then they shrink back to {d}." if gated
                    else f"{{d}} numbers grow to {{ffn}}, pass through {act}, and shrink "
                    "back to {d}."))
    if config.norm == "rms":
        changed[8] = dict(formula="u = RMSNorm(h^(L))",
                          detail="The {T} rows of {d} numbers, rescaled by their root mean "
                                 "square.")
    if not config.tied:
        changed[9] = dict(what="Turns each token's numbers into one score for every "
                               "vocabulary token, with a table of its own.",
                          formula="z = u W_U^T")
    return [replace(c, **changed[c.number]) if c.number in changed else c for c in CARDS]


def block_list(blocks: list[int]) -> str:
    """Block numbers as runs, named: [0, 1, 2, 3, 4, 6, 7] -> "blocks 0-4, 6-7", [5] ->
    "block 5"."""
    runs: list[list[int]] = []
    for b in blocks:
        if runs and b == runs[-1][-1] + 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    said = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return ("block " if len(blocks) == 1 else "blocks ") + said


def rotary_bases(config) -> str:
    """The rotary base, or (Gemma 3) each base and the blocks that turn by it."""
    bases = [config.rotary_base_of(i) for i in range(config.n_layer)]
    if len(set(bases)) == 1:
        return f"base {bases[0]:g}"
    return "; ".join(f"base {b:g} in "
                     + block_list([i for i, x in enumerate(bases) if x == b])
                     for b in sorted(set(bases)))


def bases_by_blocks(config) -> list[tuple[float, list[int]]]:
    """Each rotary base and the blocks that turn by it, in block order (one for a family with
    one base; Gemma 3: its sliding blocks' and its full blocks')."""
    bases = [config.rotary_base_of(i) for i in range(config.n_layer)]
    return [(b, [i for i, x in enumerate(bases) if x == b]) for b in dict.fromkeys(bases)]


def angles_of_base(config, t: int, base: float):
    """The angles position p turns pair i by at this base, as rotary_angles: [t, r / 2]."""

    return rotary_frequencies(t, config.rotary, base, config.rope_scaling)


def windows_said(config) -> str:
    """Which blocks see a sliding window of the last w tokens and which see all of them."""
    said = []
    for w in sorted(set(config.windows), key=lambda w: (w == 0, w)):
        blocks = [i for i, x in enumerate(config.windows) if x == w]
        one = len(blocks) == 1
        sees = ("sees" if one else "see") + (
            f" every token before {'it' if one else 'them'}." if w == 0
            else f" only the last {w} tokens (a sliding window).")
        said.append(f"{block_list(blocks).capitalize()} {sees}")
    return " ".join(said)


# ------------------------------------------------------------------ the page of one text
# `r`: a traced text (session.Run): its trace, model, text, ids, tokens and T.


def next_token(r) -> tuple:
    """Cards 10 and 11 as the page writes them: probs[-1] (the softmax of logits[-1] at
    temperature 1), then sample(probs[-1], create_rng(1))."""

    probs = r.trace.get("probs[-1]")
    return probs, sample(probs, create_rng(1))


def page_values(r) -> dict:
    """Every value the page shows, by card number, from one trace (and the header facts)."""
    cfg = r.model.config
    probs, picked = next_token(r)
    values: dict = {c.number: r.trace.get(c.path) for c in cards_for(cfg) if c.number <= 9}
    values.update({
        10: probs,
        11: picked,
        "header": {"T": r.T, "d": cfg.n_embd, "L": cfg.n_layer, "heads": cfg.n_head,
                   "d_k": cfg.d_k, "ffn": cfg.n_inner, "vocab": cfg.vocab_size,
                   "longest": cfg.n_positions},
    })
    return values


def map_stages(r) -> list[tuple[str, str, str]]:
    """The map's stages for this text: (name, operation, shape of what comes out); 3 before
    the blocks, 6 in a block, the rest after, each as the model's family computes it."""
    cfg = r.model.config
    T, d, H, dk, ff, V = r.T, cfg.n_embd, cfg.n_head, cfg.d_k, cfg.n_inner, cfg.vocab_size
    td = f"{T} × {d}"
    kv = cfg.kv_heads
    qkv = (f"q, k, v {H} × {T} × {dk}" if kv == H
           else f"q {H} × {T} × {dk}, k, v {kv} × {T} × {dk}")
    rms = " (RMSNorm, 1 + w)" if cfg.post_norms else " (RMSNorm)"
    local = sorted({w for w in cfg.windows if w})
    window = (f"; {sum(1 for w in cfg.windows if w)} of {cfg.n_layer} blocks see the last "
              + " or ".join(map(str, local)) + " keys" if local else "")
    adds = (("resid_mid = h + ln1_post(attn_out)  (RMSNorm after attention)",
             "resid_post = resid_mid + ln2_post(mlp_out)  (RMSNorm after the MLP)")
            if cfg.post_norms else ("resid_mid = h + attn_out",
                                    "resid_post = resid_mid + mlp_out"))
    return [
        ("1 Inputs", "tokenizer.encode(text)", f"{T} ids"),
        ("2 Embedding", f"W_E[ids] * {cfg.embed_scale:g}" if cfg.embed_scale else "W_E[ids]",
         td),
        ("3 Position", "+ W_P[0..T-1]" if not cfg.rotary
         else f"none added: q and k turned by position ({cfg.rotary} of {dk} each)", td),
        ("4 Norm", "ln1" if cfg.norm == "layer" else "ln1" + rms, td),
        ("5 Masked attention", f"{H} heads: {qkv}; weights {H} × {T} × {T}{window}", td),
        ("4 Add", adds[0] if not cfg.parallel
         else "none: attention and MLP both read resid_pre", td),
        ("4 Norm", "ln2" if cfg.norm == "layer" else "ln2" + rms, td),
        ("6 Feed forward", f"{td} → {T} × {ff} → GELU → {td}" if cfg.mlp == "gelu"
         and cfg.act == "gelu_new" else _ff_stage(cfg, td, T), td),
        ("4 Add", adds[1] if not cfg.parallel
         else "resid_post = resid_pre + attn_out + mlp_out", td),
        ("8 Final norm", "ln_final" if cfg.norm == "layer" else "ln_final" + rms, td),
        ("9 Linear", "u W_E^T" if cfg.tied else "u W_U", f"{T} × {V:,}"),
        ("10 Softmax", "probs[-1] = softmax(logits[-1])", f"{V:,}"),
        ("11 Output", "sample(probs[-1], rng)", "1 id"),
    ]


def _ff_stage(cfg, td: str, T: int) -> str:
    act = {"gelu_new": "GELU", "gelu": "GELU (erf)", "silu": "SiLU"}[cfg.act]
    if cfg.mlp == "gated":
        return f"{td} → gate, up {T} × {cfg.n_inner} → {act}(gate) * up → {td}"
    return f"{td} → {T} × {cfg.n_inner} → {act} → {td}"
