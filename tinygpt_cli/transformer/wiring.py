"""One block's wiring, stated once: the steps of block `i` of a model, as data derived from
its Config, which every pass composes (model.block and block_backward, the Decoder's step,
Trace.residual_parts, the attribution graph's frozen pass, circuit's edge pass, TracIn's
norm sites).

A block is a short list of Steps over named values of the block (the stream entering it is
`resid_pre`, what it hands on is the last step's value, `resid_post`):

    norm       ln1.out   = ln1(resid_pre)          the norm before attention
    attention  attn_out  = attention(ln1.out)      q/k norms, the turn, window, groups, scale
    add        resid_mid = resid_pre + attn_out    the residual add
    norm       ln2.out   = ln2(resid_mid)          the norm before the MLP
    mlp        mlp_out   = mlp(ln2.out)            plain or gated, its activation
    add        resid_post = resid_mid + mlp_out

A parallel block (GPT-NeoX) has both norms read resid_pre and one add of both branches. A
pass is one function per op (`norm`, `attention`, `mlp`, `add`) walked over the steps
(`run`), and a backward pass the same in reverse (`run_backward`): a new wiring (Gemma's
norms after attention and after the MLP, before each add) is new steps here and, for a new
operation, its op in each pass, never a pass re-taught where the norms sit.

An analysis that reads the block by its parts (DLA's heads, the graph's frozen norms) states
which knob values it implements (`Handles`); `require` refuses any other by name (exit 2)
rather than computing something else as if it were GPT-2's block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..errors import InputError
from .config import Config

__all__ = ["FAMILY_BLOCKS", "FORWARD", "Attention", "Block", "Handles", "Step", "describe",
           "require", "run", "run_backward"]


@dataclass(frozen=True)
class Step:
    """One step of a block: `op` makes the value `out` (its path inside the block) from the
    values `reads` (an add's first read is the stream, the others the branches it adds)."""

    op: str  # norm | attention | mlp | add
    out: str
    reads: tuple[str, ...]
    name: str = ""  # a norm's own name: its parameters and statistics (ln1: ln1.w, ln1.std)
    dropped: bool = False  # training's dropout on `out`: a branch just before its add
    what: str = ""  # the step's place in the block, as a refusal names it

    @property
    def kind(self) -> str:
        """The step as the knob `step` names it: "norm before attention", "attention" ..."""
        return self.what or self.op


@dataclass(frozen=True)
class Attention:
    """What the attention step does beside its weights."""

    qk_norm: bool  # an RMSNorm on each head's q and k, before the turn (Qwen3)
    rotary: int  # numbers of each head turned by the positions (0: learned positions)
    rotary_base: float
    rope_scaling: tuple  # Llama 3's, or ()
    window: int  # keys a query sees, itself included (0: all)
    groups: int  # query heads per key/value head (1: each its own)
    scale: float  # the config's attn_scale (0: 1 / sqrt(d_k))


@dataclass(frozen=True)
class Block:
    """Block i's wiring: its steps, the kind of its norms, its attention and its MLP."""

    steps: tuple[Step, ...]
    norm: str  # layer | rms
    attention: Attention
    mlp: str  # gelu (plain) | gated
    act: str
    embedding: str = "plain"  # plain: W_E's rows enter the stream | scaled: times a number

    @property
    def out(self) -> str:
        return self.steps[-1].out

    def step(self, op: str) -> Step:
        """The block's one step of op `attention` or `mlp`."""
        return next(s for s in self.steps if s.op == op)

    def input_of(self, op: str) -> str:
        """The stream value whose norm feeds the `attention` or `mlp` step (resid_pre, or
        resid_mid for the MLP of a sequential block)."""
        return self.making(self.step(op).reads[0]).reads[0]

    def making(self, value: str) -> Step:
        return next(s for s in self.steps if s.out == value)

    def norm_of(self, op: str) -> str:
        """The name of the norm that feeds the `attention` or `mlp` step (ln1, ln2)."""
        return self.making(self.step(op).reads[0]).name

    @property
    def norms(self) -> tuple[str, ...]:
        """The names of the block's norms, in order (ln1, ln2)."""
        return tuple(s.name for s in self.steps if s.op == "norm")

    @property
    def parallel(self) -> bool:
        """Both branches read the block's input (GPT-NeoX), not the MLP the attention's sum."""
        return self.input_of("mlp") == "resid_pre"

    @property
    def stream(self) -> tuple[str, ...]:
        """The values of the residual stream inside the block, in order: resid_pre, each add's."""
        return ("resid_pre",) + tuple(s.out for s in self.steps if s.op == "add")

    def added(self) -> list[tuple[str, str]]:
        """What each add puts on the stream, (added value, its add's out), in order."""
        return [(r, s.out) for s in self.steps if s.op == "add" for r in s.reads[1:]]

    def knobs(self) -> dict[str, tuple]:
        """Every knob value this block has, knob -> values: what `require` checks."""
        a = self.attention
        return {"step": tuple(dict.fromkeys(s.kind for s in self.steps)),
                "wiring": ("parallel" if self.parallel else "sequential",),
                "norm": (self.norm,), "mlp": (self.mlp,), "act": (self.act,),
                "qk_norm": (a.qk_norm,), "positions": ("rotary" if a.rotary else "learned",),
                "window": ("local" if a.window else "all",),
                "kv_groups": ("grouped" if a.groups > 1 else "per head",),
                "embedding": (self.embedding,)}


SEQUENTIAL = (
    Step("norm", "ln1.out", ("resid_pre",), "ln1", what="norm before attention"),
    Step("attention", "attn_out", ("ln1.out",), dropped=True, what="attention"),
    Step("add", "resid_mid", ("resid_pre", "attn_out"), what="residual add"),
    Step("norm", "ln2.out", ("resid_mid",), "ln2", what="norm before the MLP"),
    Step("mlp", "mlp_out", ("ln2.out",), dropped=True, what="mlp"),
    Step("add", "resid_post", ("resid_mid", "mlp_out"), what="residual add"),
)

# GPT-NeoX: both norms read the block's input; the MLP's output, then the attention's, added
PARALLEL = (
    Step("norm", "ln1.out", ("resid_pre",), "ln1", what="norm before attention"),
    Step("attention", "attn_out", ("ln1.out",), dropped=True, what="attention"),
    Step("norm", "ln2.out", ("resid_pre",), "ln2", what="norm before the MLP"),
    Step("mlp", "mlp_out", ("ln2.out",), dropped=True, what="mlp"),
    Step("add", "resid_post", ("resid_pre", "mlp_out", "attn_out"), what="residual add"),
)


# Gemma 3: a norm after attention (ln1_post) and one after the MLP (ln2_post), each on its
# branch before the add
POST_NORMED = (
    Step("norm", "ln1.out", ("resid_pre",), "ln1", what="norm before attention"),
    Step("attention", "attn_out", ("ln1.out",), what="attention"),
    Step("norm", "ln1_post.out", ("attn_out",), "ln1_post", dropped=True,
         what="norm after attention"),
    Step("add", "resid_mid", ("resid_pre", "ln1_post.out"), what="residual add"),
    Step("norm", "ln2.out", ("resid_mid",), "ln2", what="norm before the MLP"),
    Step("mlp", "mlp_out", ("ln2.out",), what="mlp"),
    Step("norm", "ln2_post.out", ("mlp_out",), "ln2_post", dropped=True,
         what="norm after the MLP"),
    Step("add", "resid_post", ("resid_mid", "ln2_post.out"), what="residual add"),
)


def describe(config: Config, i: int) -> Block:
    """Block i of a model with this config: the one description every pass follows. Made
    once per Config object and kept on it (a pure function of its fields: a copy made by
    dataclasses.replace makes its own), since every pass of every block asks for it and
    hashing a Config for a cache costs more than a small block's norm."""
    made = config.__dict__.get("_blocks")
    if made is None:
        made = tuple(_describe(config, j) for j in range(config.n_layer))
        object.__setattr__(config, "_blocks", made)
    return made[i]


def _describe(config: Config, i: int) -> Block:
    steps = PARALLEL if config.parallel else POST_NORMED if config.post_norms else SEQUENTIAL
    return Block(steps, config.norm,
                 Attention(config.qk_norm, config.rotary, config.rotary_base_of(i),
                           config.rope_scaling, config.window(i),
                           config.n_head // config.kv_heads, config.attn_scale),
                 config.mlp, config.act, "scaled" if config.embed_scale else "plain")


def blocks(config: Config) -> list[Block]:
    return [describe(config, i) for i in range(config.n_layer)]


def run(block: Block, ops: Mapping[str, Callable], h):
    """A forward pass of the block from its input h: each step by ops[step.op](step, *its
    reads); the block's output."""
    values = {"resid_pre": h}
    for s in block.steps:
        op = ops.get(s.op)
        if op is None:
            raise ValueError(f"this pass has no op for the step {s.kind!r} ({s.op})")
        values[s.out] = op(s, *[values[r] for r in s.reads])
    return values[block.out]


def run_backward(block: Block, ops: Mapping[str, Callable], d, start: str | None = None):
    """The block in reverse from d of its output (or of its value `start`): each step by
    ops[step.op](step, d of its out) -> d of each of its reads (None: no path back there), a
    value's gradient complete when its own step is reached (every reader comes after it),
    each sum added in the order of the steps walked back. d of resid_pre (None when nothing
    reached it)."""
    ds = {start or block.out: d}
    for s in reversed(block.steps):
        d = ds.pop(s.out, None)
        if d is None:
            continue
        op = ops.get(s.op)
        if op is None:
            raise ValueError(f"this pass has no op for the step {s.kind!r} ({s.op})")
        for r, dr in zip(s.reads, op(s, d), strict=True):
            if dr is not None:
                ds[r] = dr if r not in ds else ds[r] + dr
    return ds.get("resid_pre")


# ------------------------------------------------------------------ what an analysis handles


# The ops model.py's passes (forward, backward, the Decoder) implement.
MODEL_OPS = ("norm", "attention", "mlp", "add")


@dataclass(frozen=True)
class Handles:
    """The knob values an analysis implements, knob -> values (a knob left out: all the
    values the families have today, FAMILIES); `any_step`: every step whose op the model's
    passes compute, wherever it sits (an analysis that only runs those passes and reads
    their values)."""

    knobs: tuple[tuple[str, tuple], ...] = ()
    any_step: bool = False

    def allowed(self, knob: str) -> tuple:
        return dict(self.knobs).get(knob, FAMILIES[knob])


def handles(**knobs) -> Handles:
    """An analysis's declaration: handles(wiring=("sequential",)) takes every value the
    families have of each other knob, and of `wiring` only those named."""
    unknown = set(knobs) - set(FAMILIES)
    if unknown:
        raise ValueError(f"no knob {', '.join(sorted(unknown))}")
    return Handles(tuple((k, tuple(v)) for k, v in knobs.items()))


# Every knob value of the families tinygpt reads today (GPT-2, GPT-Neo, GPT-NeoX, Llama,
# Qwen2/3): what an analysis written for them all handles. A new family's new value (a norm
# after attention, a new norm kind) is in no analysis's list until it says it handles it.
FAMILIES: dict[str, tuple] = {
    "step": ("norm before attention", "attention", "residual add", "norm before the MLP",
             "mlp"),
    "wiring": ("sequential", "parallel"),
    "norm": ("layer", "rms"),
    "mlp": ("gelu", "gated"),
    "act": ("gelu_new", "gelu", "silu"),
    "qk_norm": (False, True),
    "positions": ("learned", "rotary"),
    "window": ("all", "local"),
    "kv_groups": ("per head", "grouped"),
    "embedding": ("plain", "scaled"),
}

# What an analysis written for the families' blocks handles: their knob values and steps.
FAMILY_BLOCKS = Handles()
# What an analysis that only runs the model's passes and reads their values handles: any
# step those passes compute, so a new wiring of known ops (a norm after attention) with it.
FORWARD = Handles(any_step=True)


def lacking(config: Config, can: Handles = FAMILY_BLOCKS) -> list[tuple[str, object]]:
    """(knob, value) of this model's blocks that `can` does not handle, in block order."""
    out: list[tuple[str, object]] = []
    for b in blocks(config):
        for knob, values in b.knobs().items():
            if knob == "step" and can.any_step:
                values = tuple(s.kind for s in b.steps if s.op not in MODEL_OPS)
                allowed: tuple = ()
            else:
                allowed = can.allowed(knob)
            out += [(knob, v) for v in values if v not in allowed and (knob, v) not in out]
    return out


def require(config: Config, what: str, can: Handles = FAMILY_BLOCKS) -> None:
    """InputError (exit 2) naming the first knob value of this model's blocks that the
    analysis `what` does not implement, so that it never answers for another block as if it
    were one it knows."""

    missing = lacking(config, can)
    if missing:
        said = ", ".join(f"a step {v!r}" if k == "step" else f"{k} {v!r}"
                         for k, v in missing)
        raise InputError(f"{what} is not available for this {config.model_type} model: its "
                         f"block has {said}, which {what} does not implement")

