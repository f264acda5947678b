"""What global rank 0 shows while a run goes: a progress bar on a terminal, one
line per log interval when the output is a file or a pipe (CI, torchrun logs).

Other ranks get a console that says nothing (a null object), so the trainer never
asks "am I rank 0?" before printing.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where the bar starts: a bare host trains without tqdm
    from tqdm import tqdm


class Console:
    def __init__(self) -> None:
        self._bar: tqdm[Any] | None = None

    def begin(self, total_steps: int, start_step: int = 0) -> None:
        """Start the progress bar (on a terminal only) once the number of steps is known."""
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ModuleNotFoundError:  # a bare host: training needs no tqdm; a line per log interval instead
                return
            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)

    def say(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def __call__(self, row: dict[str, Any]) -> None:
        """The trainer's log hook: show a row of metrics.jsonl."""
        if row["kind"] == "eval":
            self.say(
                f"epoch {row['epoch']} step {row['step']} eval: test loss {row['test_loss']:.4f} "
                f"accuracy {row['test_accuracy']:.2%}"
            )
            return
        text = (
            f"loss {row['loss']:.4f} acc {row['accuracy']:.3f} lr {row['lr']:.4g} "
            f"{row['samples_per_second']:.0f} img/s {1000 * row['step_time_seconds']:.0f} ms/step"
        )
        if self._bar is not None:
            self._bar.set_description(f"epoch {row['epoch']}")
            self._bar.set_postfix_str(text)
        else:
            self.say(f"epoch {row['epoch']} step {row['step']}/{row['total_steps']} {text}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class SilentConsole(Console):
    def begin(self, total_steps: int, start_step: int = 0) -> None:
        pass

    def say(self, message: str) -> None:
        pass

    def __call__(self, row: dict[str, Any]) -> None:
        pass
