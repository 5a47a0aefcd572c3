"""Every command of `tinygpt` by name, known without importing the module that defines it.

A command line names one command, and only the module of cli/ that defines it is imported
(cli.app.COMMANDS); `tinygpt --help` lists every command by name and the first line of its
docstring, which this table holds, so that the listing imports none of them.
tests/test_structure.py checks the table against the commands themselves (their modules,
their order in the listing, and the listing itself at several widths).
"""

from __future__ import annotations

from typing import NamedTuple

# name: (module of cli/ that defines it, the first line of its docstring), in the order
# `tinygpt --help` lists them: the seed page's cards, then the whole page, the analyses and
# training; a group of commands (`tinygpt sae ...`) last, where Typer lists groups.
LISTED: dict[str, tuple[str, str]] = {
    "encode": ("inspect", "Card 1: split the text into tokens; each token is an id from the "
                          "vocabulary."),
    "embed": ("cards", "Card 2: each token id picks its row of the embedding table W_E."),
    "pos": ("cards", "Card 3: each position's row of W_P, added to the token rows (--sum shows the "
                     "result)."),
    "norm": ("cards", "Card 4: a norm of one block (LayerNorm: each token's mean and std; "
             "RMSNorm: its rms)."),
    "attn": ("cards", "Card 5: the T × T attention grid of one head as a heatmap (rows attend to "
                      "columns)."),
    "mlp": ("cards", "Card 6: the feed-forward output of one block, and its most active hidden "
                     "neurons."),
    "blocks": ("cards", "Card 7: the residual stream after each block, what each block changed, "
                        "the top guess."),
    "final-norm": ("cards", "Card 8: the final norm after the last block."),
    "logits": ("cards", "Card 9: one score per vocabulary token at a position; lists the highest."),
    "probs": ("cards", "Card 10: softmax turns the scores into chances that add up to 1."),
    "sample": ("cards", "Card 11: pick one next token from the chances with a seeded generator."),
    "generate": ("inspect", "Write a continuation of the text, one token at a time, as it is "
                            "produced."),
    "decode": ("inspect", "Turn token ids back into text."),
    "trace": ("inspect", "Print any value of the forward pass by its path, or --list them all."),
    "review": ("page", "The whole \"Quick review\" page for a text: the facts, then all 11 cards "
                       "with real values."),
    "map": ("page", "The model as a diagram, every arrow labelled with its shape for this text."),
    "lens": ("explain", "Logit lens: the likeliest next token at every position after every "
                        "stage."),
    "dla": ("explain", "Direct logit attribution: each part of the final stream's share of the "
                       "target's logit."),
    "ablate": ("explain", "Ablation: take out a head or an MLP; the change in log p(target) and "
                          "the KL divergence."),
    "patch": ("explain", "Activation patching: how much of the clean prediction each clean value "
                         "restores."),
    "attribute": ("explain", "Input attribution: each input token's share of the target's score, "
                             "by the backward pass."),
    "means": ("explain", "Store each head's and MLP's mean output over the validation text, for "
                         "--mode mean."),
    "graph": ("graph", "Attribution graph: the transcoder features, tokens and errors behind a "
                       "prediction."),
    "circuit": ("circuits", "Edge attribution: which connections between components carry the "
                            "prediction."),
    "qk": ("circuits", "QK attribution: one head's attention scores split by where the query and "
                       "key came from."),
    "score": ("texts", "How surprised the model is by each token: surprisal, rank, chance, "
                       "entropy; totals."),
    "heads": ("texts", "Which heads do known jobs: previous-token, duplicate-token and induction "
                       "scores."),
    "neurons": ("texts", "MLP neurons: which fire most on a text and which tokens each one pushes "
                         "up."),
    "diff": ("texts", "Where two runs part: two texts through the model, or one text through two "
                      "models."),
    "quant": ("texts", "What quantization changed: one text through a model and its quantized "
                       "copy."),
    "history": ("history", "How the model's answer, a value or its heads changed over training, "
                           "snapshot by snapshot."),
    "why": ("history", "Where the model learned a prediction: exact matches, and the most "
                       "influential windows."),
    "steer": ("directions", "Build a steering vector from pairs of texts and test it on held-out "
                            "pairs."),
    "probe": ("directions", "Fit a logistic-regression probe per token, beside a control task."),
    "info": ("inspect", "The model's configuration, parameter counts, weights file and tokenizer."),
    "train-tokenizer": ("train", "Train the byte-level BPE tokenizer (the held-out last part is "
                                 "left out)."),
    "train": ("train", "Train the model in NumPy; OUT becomes a weights folder holding the best "
                       "checkpoint."),
    "model-card": ("train", "Write MODEL_CARD.md and loss_curve.svg for a trained weights folder."),
    "mcp": ("agents", "Serve the commands to an agent as MCP tools over stdio (the mcp "
                      "extra)."),
    "transcoder": ("graph", "Transcoders: one sparse dictionary per block's MLP, from ln2.out to "
                            "mlp_out."),
    "sae": ("features", "Sparse autoencoders: train one on a site, evaluate it on held-out text, "
                        "show a latent."),
}


class Effects(NamedTuple):
    """What a command does besides answering: the MCP server serves no command that writes
    files or runs for minutes, and no option that does (mcp_server.tools); `why` is what an
    agent is told (the cache of slow results, cache.py, is not a file the caller names).
    tests/test_mcp_safety.py holds every command of the registry to it: a command with
    --force (it would write over a file) but no --save declares what it writes."""

    why: str = ""
    writes_files: bool = False
    long_running: bool = False
    # (option's word, why): an option that writes files or runs for minutes, left out
    options_left_out: tuple[tuple[str, str], ...] = ()


# What each command does besides answering, by its full name (a group's command: `sae train`);
# a command not named here only reads and answers within seconds.
EFFECTS: dict[str, Effects] = {
    "why": Effects("builds a gradient index of every training window the first time it is "
                   "asked (minutes, on every core); run it in a shell", long_running=True,
                   writes_files=True),
    "means": Effects("averages over the whole validation text and writes a file",
                     writes_files=True, long_running=True),
    "train-tokenizer": Effects("trains a tokenizer and writes it", writes_files=True,
                               long_running=True),
    "train": Effects("trains a model (minutes to hours) and writes a weights folder",
                     writes_files=True, long_running=True),
    "model-card": Effects("writes files into a weights folder", writes_files=True),
    "transcoder train": Effects("trains transcoders (minutes) and writes them",
                                writes_files=True, long_running=True),
    "sae train": Effects("trains a sparse autoencoder (minutes) and writes it",
                         writes_files=True, long_running=True),
    "sae export": Effects("writes an SAELens folder", writes_files=True),
    "mcp": Effects("is this server", long_running=True),
    "lens": Effects(options_left_out=(("fit", "lens --fit trains a tuned lens and writes it"),)),
    "steer": Effects(options_left_out=(("out", "steer --out writes the direction to a file"),)),
    "probe": Effects(options_left_out=(("out", "probe --out writes the direction to a file"),)),
    "neurons": Effects(options_left_out=(("neuron", "neurons --neuron reads the whole training "
                                          "text the first time it is asked (minutes)"),)),
    # Left out whether or not their cache is built: the tool list is fixed when the server
    # starts, and the cache a call needs depends on its own --data, --windows, transcoders
    # or SAE, so no rule on the server's side could tell a quick call from a slow one.
    "graph": Effects("reads the training text for its features' top windows the first time "
                     "it is asked (minutes; cached); run it in a shell", long_running=True),
    "sae feature": Effects("reads the training text for the latent's top windows the first "
                           "time it is asked (minutes; cached); run it in a shell",
                           long_running=True),
}


# The group's options that may come before the command without being about the group
# (`tinygpt --weights DIR probs`), each with its value (--debug, allowed anywhere, is taken out
# of the arguments before this: entry.run).
LEADING_OPTIONS = ("--weights", "--threads")


def chosen_command(args: list[str]) -> str | None:
    """The one command these arguments run, whose module alone is then imported, or None
    when they need all of them: --help, no command, an unknown one, or --each-line (whose
    errors list the commands that read a text). Before the command, --weights DIR and
    --threads N (or --weights=DIR) are passed over; any other option there (--help,
    --version) is about the group."""
    words = iter(args)
    name = None
    for a in words:
        if a in LEADING_OPTIONS:
            next(words, None)  # its value
        elif a.split("=", 1)[0] not in LEADING_OPTIONS:
            name = None if a.startswith("-") else a
            break
    options = args[: args.index("--")] if "--" in args else args
    if any(a == "--each-line" or a.startswith("--each-line=") for a in options):
        return None
    return name if name in LISTED else None


# The module (under tinygpt_cli/) whose HANDLES says which blocks the analysis behind a
# command implements (cli.common.handles_of): the command refuses any other by name, exit 2, when
# it loads its model (cli.common.load). A command not named here runs only the model's own
# passes and reads their values (wiring.FORWARD: any step those passes compute).
ANALYSES: dict[str, str] = {
    "review": "transformer.page", "map": "transformer.page", "lens": "analysis.lens",
    "dla": "analysis.dla",
    "ablate": "analysis.ablate", "patch": "analysis.patch", "attribute": "analysis.attribute",
    "means": "analysis.means", "graph": "analysis.graph", "circuit": "analysis.circuit",
    "qk": "analysis.qk", "score": "analysis.score", "heads": "analysis.heads",
    "neurons": "analysis.neurons", "diff": "analysis.diff", "history": "analysis.history",
    "why": "analysis.why", "steer": "analysis.steer", "probe": "analysis.probe",
    "transcoder train": "analysis.transcoder", "transcoder eval": "analysis.transcoder",
    "sae train": "analysis.sae", "sae eval": "analysis.sae", "sae feature": "analysis.sae",
    "quant": "analysis.quant",
}
