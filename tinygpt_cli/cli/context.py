"""The run context: what one command line carries from the entry point through the command to
its session and its renderer, in place of module state.

entry.run makes one (`RunContext()`) and runs the command line with it (click's `obj`); the
group's --weights is set on it; --each-line adds the folders opened once and the passes made
ahead for the lines (cli/batch.py). Each run of a command gets its own copy (`for_command`)
holding that run's --steer options, --quiet, the note of what was changed and the steering
made from the options, so that nothing of one command reaches the next. A program runs
commands with contexts of its own:

    from tinygpt_cli.cli.context import RunContext
    from tinygpt_cli.cli.entry import run
    run(["probs", "Lily wanted to", "--json"], context=RunContext(weights="my-weights"))

(`run` ends with SystemExit and the exit code, as the command line does.) With `presented=[]`
a command prints nothing: its result is kept there (render.output.Presented), which is how
`tinygpt_cli.surfaces.api` gives the commands to Python as functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple


class SteerOptions(NamedTuple):  # not a frozen dataclass: 0.5 ms less of every start-up
    """--steer, --steer-away, --steer-vector, --steer-layer, --steer-scale as given."""

    steer: str | None = None
    steer_away: str | None = None
    steer_vector: str | None = None
    steer_layer: int | None = None
    steer_scale: float = 1.0

    @property
    def given(self) -> bool:
        """Is a direction given (the run is steered, even at scale 0)?"""
        return (self.steer, self.steer_away, self.steer_vector) != (None, None, None)


@dataclass
class RunContext:
    """`weights`: the folder given before the command (`tinygpt --weights DIR probs`), used
    when the command is given none; `cluster`, the --cluster given before it. `opened`:
    folder -> Folder or Model, each opened once while it is a dict (--each-line). `ahead`:
    the --each-line batch (ahead.Ahead) whose final_norm the sessions take their clean
    passes from.

    Of one command's run (for_command): `command` its name, `steer` its steering options
    (None: the command is not @steerable, and asking for steering is a bug), `quiet`,
    `changed` (the note the next view or picture starts with), `steerings` (the steering made
    once per model) and `said` (the steering lines said once the command has done its work)."""

    weights: str | Path | None = None
    cluster: str | None = None  # --cluster as given (cluster.chosen adds $TINYGPT_CLUSTER)
    cluster_wait: float | None = None  # --cluster-wait as given (cluster.wait_chosen)
    opened: dict | None = None
    ahead: Any = None
    command: str | None = None
    steer: SteerOptions | None = None
    quiet: bool = False
    changed: str | None = None
    steerings: dict = field(default_factory=dict)
    said: list = field(default_factory=list)
    given: frozenset = frozenset()  # the command's options given on the command line
    # a list: present() (render/output.py) appends each result there instead of printing it
    # (the notebook API, tinygpt_cli/surfaces/api.py, runs the commands with one)
    presented: list | None = None
    saes: tuple = ()  # a command's --sae SAEs, for latents sae.SITE.N in --ablate and trace
    # --chat: the text is the chat template's rendering, its special tokens written in it (the
    # folder's <bos> is not added again: cli/batch.py)
    chat: bool = False
    last: int | None = None  # --last N: a long text's last N tokens are read
    offers_last: bool = False  # the command takes --last (its refusals may name it)
    cut: dict | None = None  # what --last cut, for the JSON document (render.output.present)
    # the console script's own process (entry.main): it may tune the process's memory
    # (cli/process.py); a program running commands (the API, MCP) leaves its process alone
    own_process: bool = False

    def for_command(self, command: str | None, steer: SteerOptions | None,
                    quiet: bool = False) -> RunContext:
        """A fresh copy for one run of a command: what lasts the whole line (weights, the
        folders opened, the passes made ahead) kept, the command's own state new."""
        return replace(self, command=command, steer=steer, quiet=quiet, changed=None,
                       steerings={}, said=[], given=frozenset(), saes=(), last=None,
                       offers_last=False, cut=None)
