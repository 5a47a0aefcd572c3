"""The seed page's "Quick review", card by card: where each value lives and how it is made.

Each card names the trace path that holds its value, the formula, and the command that shows
it, so `tinygpt review` and `tinygpt map` draw the page from this one list.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    number: int
    title: str
    what: str  # one sentence, as the seed page says it
    formula: str
    path: str  # where the value lives in the trace
    command: str  # the command that shows it


CARDS = [
    Card(1, "Inputs", "Your text, split into tokens; each token is an id from the vocabulary.",
         "ids = tokenizer.encode(text)", "ids", "tinygpt encode TEXT"),
    Card(2, "Embedding", "Each id picks one row from a table of learned numbers.",
         "x_i = W_E[t_i]", "token_embeddings", "tinygpt embed TEXT"),
    Card(3, "Position", "Each position gets its own row too, added to the token's row; that "
         "is how the model knows the order.",
         "h_i = W_E[t_i] + W_P[i]", "embeddings", "tinygpt pos TEXT --sum"),
    Card(4, "Add and norm", "Norm rescales each token's numbers to a steady range, before "
         "attention and before the feed-forward layer; add keeps what came in.",
         "x + Sublayer(LayerNorm(x))", "layers[0].ln1.out", "tinygpt norm TEXT --layer 0"),
    Card(5, "Masked attention", "Each token looks at itself and the tokens before it and "
         "pulls in what it needs; it cannot look ahead.",
         "softmax(Q K^T / sqrt(d_k) + M) V,  M_ij = -inf when j > i",
         "layers[0].heads[0].weights", "tinygpt attn TEXT --layer 0 --head 0"),
    Card(6, "Feed forward", "Each token's numbers go through a small network on their own.",
         "GELU(x W_1 + b_1) W_2 + b_2", "layers[0].mlpOut", "tinygpt mlp TEXT --layer 0"),
    Card(7, "Repeated blocks", "The block repeats; each one refines the numbers further.",
         "h^(l+1) = Block_l(h^(l))", "layers.length", "tinygpt blocks TEXT"),
    Card(8, "Final norm", "One more norm after the last block, before the scores are made.",
         "u = LayerNorm(h^(L))", "lnFinal.out", "tinygpt final-norm TEXT"),
    Card(9, "Linear", "Turns each token's numbers into one score for every vocabulary token, "
         "reusing the embedding table.", "z = u W_E^T", "logits", "tinygpt logits TEXT"),
    Card(10, "Softmax", "Turns the scores into chances between 0 and 1 that add up to 1.",
         "p_t = exp(z_t) / sum_s exp(z_s)", "probabilities(logits[T-1], 1)",
         "tinygpt probs TEXT"),
    Card(11, "Output", "Pick one token by its chance, add it to the text, and run again.",
         "P(t_{T+1} | t_1 .. t_T)", "sample(probs, create_rng(1))", "tinygpt sample TEXT --seed 1"),
]
