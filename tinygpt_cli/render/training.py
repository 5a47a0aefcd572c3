"""train's progress on stderr: a header line and a bar with the loss, the validation loss and
the speed, started at the first note or step (so that an error before then, of the folder or
the data, is the one line on stderr)."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..escapes import escape_line


class TrainingProgress(contextlib.ExitStack):
    """Use as a context manager; hand on_step and on_note to train.loop.train, then say
    finished(...)."""

    def __init__(self, train_files: list[Path], val_files: list[Path], steps: int):
        super().__init__()
        self.header = (f"train: {', '.join(f.name for f in train_files)}; validation: "
                       f"{', '.join(f.name for f in val_files) or 'none'}")
        self.steps, self.console = steps, Console(stderr=True)
        self.shown: Progress | None = None

    def bar(self) -> Progress:
        if self.shown is None:
            self.console.print(self.header, markup=False, highlight=False)
            # The loss shows "-" until the first step has one (never "nan").
            columns = [TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                       TextColumn("loss {task.fields[loss]}  val {task.fields[val]}  "
                                  "{task.fields[tps]:,.0f} tok/s"), TimeElapsedColumn(),
                       TimeRemainingColumn()]
            self.shown = self.enter_context(Progress(*columns, console=self.console))
            self.shown.add_task("train", total=self.steps, loss="-", val="-", tps=0.0)
        return self.shown

    def on_step(self, info) -> None:
        fields = {"loss": f"{info.loss:.3f}", "tps": info.tokens_per_s}
        if info.val_loss is not None:
            fields["val"] = f"{info.val_loss:.3f}"
        progress = self.bar()
        progress.update(progress.task_ids[0], completed=info.step, **fields)

    def on_note(self, text: str) -> None:
        self.bar().console.print(text, markup=False, highlight=False)

    def finished(self, best: float, out: Path) -> None:
        """The last line: the best validation loss, and where the weights are."""

        self.console.print((f"best validation loss {best:.4f} nats/token" if math.isfinite(best)
                            else "no validation data") + f"; weights in {escape_line(str(out))}",
                           markup=False, highlight=False)
