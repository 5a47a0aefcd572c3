"""The GPT-2 forward pass as a composition of the ops, recording every value in a Trace,
and its backward pass, which reads the same Trace.

Parameters are a flat dict named as in the Hugging Face GPT-2 file without the
`transformer.` prefix (`h.0.attn.c_attn.weight`, `ln_f.bias`, `wte.weight`, ...).
"""

from __future__ import annotations

import numpy as np

from . import ops
from .config import Config
from .trace import Trace


def param_shapes(config: Config) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in file order."""
    d, ff = config.n_embd, config.n_inner
    shapes: dict[str, tuple[int, ...]] = {
        "wte.weight": (config.vocab_size, d),
        "wpe.weight": (config.n_positions, d),
    }
    for i in range(config.n_layer):
        p = f"h.{i}."
        shapes.update(
            {
                p + "ln_1.weight": (d,),
                p + "ln_1.bias": (d,),
                p + "attn.c_attn.weight": (d, 3 * d),
                p + "attn.c_attn.bias": (3 * d,),
                p + "attn.c_proj.weight": (d, d),
                p + "attn.c_proj.bias": (d,),
                p + "ln_2.weight": (d,),
                p + "ln_2.bias": (d,),
                p + "mlp.c_fc.weight": (d, ff),
                p + "mlp.c_fc.bias": (ff,),
                p + "mlp.c_proj.weight": (ff, d),
                p + "mlp.c_proj.bias": (d,),
            }
        )
    shapes["ln_f.weight"] = (d,)
    shapes["ln_f.bias"] = (d,)
    return shapes


def init_params(
    config: Config, rng: np.random.Generator, dtype=np.float32
) -> dict[str, np.ndarray]:
    """GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 L)."""
    params = {}
    resid_std = 0.02 / np.sqrt(2 * config.n_layer)
    for name, shape in param_shapes(config).items():
        if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            value = np.ones(shape)
        elif name.endswith(".bias"):
            value = np.zeros(shape)
        elif name.endswith("c_proj.weight"):
            value = rng.normal(0.0, resid_std, shape)
        elif name == "wpe.weight":
            value = rng.normal(0.0, 0.01, shape)
        else:
            value = rng.normal(0.0, 0.02, shape)
        params[name] = value.astype(dtype)
    return params


def forward(
    params: dict[str, np.ndarray],
    config: Config,
    ids: np.ndarray,
    *,
    dropout: float = 0.0,
    rng: np.random.Generator | None = None,
) -> Trace:
    """Run the model on ids [T] or [B, T] and record every value it computes.

    With dropout > 0 (training), embeddings, attention outputs and MLP outputs are dropped
    before each residual add; the masks are kept in the trace for the backward pass.
    """
    ids = np.asarray(ids)
    batched = ids.ndim == 2
    ids2 = ids if batched else ids[None, :]
    _, t = ids2.shape
    if t > config.n_positions:
        raise ValueError(f"{t} tokens is more than the model's limit of {config.n_positions}")
    eps = config.layer_norm_epsilon
    v: dict[str, np.ndarray] = {"ids": ids2}
    masks: dict[str, np.ndarray] = {}

    def drop(name: str, x: np.ndarray) -> np.ndarray:
        if dropout <= 0.0:
            return x
        mask = ops.dropout_mask(x.shape, dropout, rng, x.dtype)
        masks[name] = mask
        return x * mask

    # cards 1-3: ids -> token rows + position rows
    v["token_embeddings"] = ops.embedding(params["wte.weight"], ids2)  # [B, T, d]
    v["position_embeddings"] = ops.position_embedding(params["wpe.weight"], t)  # [T, d]
    v["embeddings"] = v["token_embeddings"] + v["position_embeddings"]  # [B, T, d]
    h = drop("embeddings", v["embeddings"])

    # card 7: the same block, n_layer times
    for i in range(config.n_layer):
        p, L = f"h.{i}.", f"layers.{i}."
        v[L + "resid_pre"] = h
        # card 4: norm before attention
        x, v[L + "ln1.mean"], v[L + "ln1.std"] = ops.layer_norm(
            h, params[p + "ln_1.weight"], params[p + "ln_1.bias"], eps
        )
        v[L + "ln1.out"] = x
        # card 5: masked attention, all heads at once
        qkv = ops.linear(x, params[p + "attn.c_attn.weight"], params[p + "attn.c_attn.bias"])
        q, k, vv = np.split(qkv, 3, axis=-1)  # 3 x [B, T, d]
        v[L + "q"] = ops.split_heads(q, config.n_head)  # [B, H, T, d_k]
        v[L + "k"] = ops.split_heads(k, config.n_head)
        v[L + "v"] = ops.split_heads(vv, config.n_head)
        v[L + "z"], v[L + "scores"], v[L + "weights"] = ops.attention(
            v[L + "q"], v[L + "k"], v[L + "v"]
        )  # [B, H, T, d_k], [B, H, T, T], [B, H, T, T]
        v[L + "z_merged"] = ops.merge_heads(v[L + "z"])  # [B, T, d]
        v[L + "attn_out"] = ops.linear(
            v[L + "z_merged"], params[p + "attn.c_proj.weight"], params[p + "attn.c_proj.bias"]
        )
        # card 4: add
        h = v[L + "resid_mid"] = h + drop(L + "attn_out", v[L + "attn_out"])
        # card 6: norm, then feed forward
        x, v[L + "ln2.mean"], v[L + "ln2.std"] = ops.layer_norm(
            h, params[p + "ln_2.weight"], params[p + "ln_2.bias"], eps
        )
        v[L + "ln2.out"] = x
        v[L + "mlp_pre"] = ops.linear(x, params[p + "mlp.c_fc.weight"], params[p + "mlp.c_fc.bias"])
        v[L + "mlp_post"] = ops.gelu(v[L + "mlp_pre"])  # [B, T, ff]
        v[L + "mlp_out"] = ops.linear(
            v[L + "mlp_post"], params[p + "mlp.c_proj.weight"], params[p + "mlp.c_proj.bias"]
        )
        h = v[L + "resid_post"] = h + drop(L + "mlp_out", v[L + "mlp_out"])

    # card 8: final norm; card 9: linear head tied to the embedding table
    v["ln_final.out"], v["ln_final.mean"], v["ln_final.std"] = ops.layer_norm(
        h, params["ln_f.weight"], params["ln_f.bias"], eps
    )
    v["logits"] = ops.unembed(v["ln_final.out"], params["wte.weight"])  # [B, T, vocab]

    if not batched:
        v = {name: (x if name == "position_embeddings" else x[0]) for name, x in v.items()}
    return Trace(v, config, masks=masks, batched=batched)


def backward(
    params: dict[str, np.ndarray], config: Config, trace: Trace, dlogits: np.ndarray
) -> dict[str, np.ndarray]:
    """Gradients of the loss for every parameter, given d loss / d logits [B, T, vocab].

    Walks the forward pass in reverse, reading the values the trace recorded.
    """
    if not trace.batched:
        raise ValueError("backward needs the trace of a batched forward pass")
    v, masks = trace.values, trace.masks
    grads: dict[str, np.ndarray] = {}

    def undrop(name: str, d: np.ndarray) -> np.ndarray:
        return d * masks[name] if name in masks else d

    du, grads["wte.weight"] = ops.unembed_backward(dlogits, v["ln_final.out"], params["wte.weight"])
    dh, grads["ln_f.weight"], grads["ln_f.bias"] = ops.layer_norm_backward(
        du, v[f"layers.{config.n_layer - 1}.resid_post"], params["ln_f.weight"],
        v["ln_final.mean"], v["ln_final.std"],
    )
    for i in reversed(range(config.n_layer)):
        p, L = f"h.{i}.", f"layers.{i}."
        # resid_post = resid_mid + mlp_out: the gradient flows both ways
        dmlp_out = undrop(L + "mlp_out", dh)
        dpost, grads[p + "mlp.c_proj.weight"], grads[p + "mlp.c_proj.bias"] = ops.linear_backward(
            dmlp_out, v[L + "mlp_post"], params[p + "mlp.c_proj.weight"]
        )
        dpre = ops.gelu_backward(dpost, v[L + "mlp_pre"])
        dx, grads[p + "mlp.c_fc.weight"], grads[p + "mlp.c_fc.bias"] = ops.linear_backward(
            dpre, v[L + "ln2.out"], params[p + "mlp.c_fc.weight"]
        )
        dx, grads[p + "ln_2.weight"], grads[p + "ln_2.bias"] = ops.layer_norm_backward(
            dx, v[L + "resid_mid"], params[p + "ln_2.weight"], v[L + "ln2.mean"], v[L + "ln2.std"]
        )
        dh = dh + dx
        # resid_mid = resid_pre + attn_out
        dattn = undrop(L + "attn_out", dh)
        dz, grads[p + "attn.c_proj.weight"], grads[p + "attn.c_proj.bias"] = ops.linear_backward(
            dattn, v[L + "z_merged"], params[p + "attn.c_proj.weight"]
        )
        dq, dk, dv = ops.attention_backward(
            ops.split_heads(dz, config.n_head), v[L + "q"], v[L + "k"], v[L + "v"], v[L + "weights"]
        )
        dqkv = np.concatenate(
            [ops.merge_heads(dq), ops.merge_heads(dk), ops.merge_heads(dv)], axis=-1
        )
        dx, grads[p + "attn.c_attn.weight"], grads[p + "attn.c_attn.bias"] = ops.linear_backward(
            dqkv, v[L + "ln1.out"], params[p + "attn.c_attn.weight"]
        )
        dx, grads[p + "ln_1.weight"], grads[p + "ln_1.bias"] = ops.layer_norm_backward(
            dx, v[L + "resid_pre"], params[p + "ln_1.weight"], v[L + "ln1.mean"], v[L + "ln1.std"]
        )
        dh = dh + dx
    demb = undrop("embeddings", dh)
    grads["wpe.weight"] = ops.position_embedding_backward(demb, params["wpe.weight"])
    grads["wte.weight"] += ops.embedding_backward(demb, params["wte.weight"], v["ids"])
    return {name: grads[name] for name in params}


def loss_and_grads(params, config, ids, targets, *, dropout=0.0, rng=None):
    """One training step's worth of math: mean cross-entropy and its gradients."""
    trace = forward(params, config, ids, dropout=dropout, rng=rng)
    loss, dlogits = ops.cross_entropy_with_grad(trace.values["logits"], targets)
    grads = backward(params, config, trace, dlogits)
    return loss, grads
