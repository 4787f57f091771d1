"""Console progress: the bar shows the loss of the step it counts (issue 24: it showed the previous
step's), it is drawn only on a terminal, and elsewhere plain step lines say what a long job needs."""

from __future__ import annotations

import io

from truestep.telemetry.progress import Progress, StepStats


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def stats(step: int, loss: float, **kw: object) -> StepStats:
    return StepStats(
        step, loss, **{"lr": 3e-4, "grad_norm": 1.5, "tokens_per_s": 100.0, "peak_mem_bytes": 2**30, **kw}
    )  # type: ignore[arg-type]


def test_the_bar_shows_the_loss_of_the_step_it_just_counted() -> None:
    out = Terminal()
    bar = Progress(total=3, start=0, enabled=True, every=1, out=out)
    bar.bar.mininterval = 0  # draw at every update (tqdm otherwise skips redraws within 0.1 s)
    bar.update(stats(1, 5.25))
    first = out.getvalue().rsplit("\r", 1)[-1]
    assert "1/3" in first and "loss=5.2500" in first, first
    bar.update(stats(2, 4.5))
    second = out.getvalue().rsplit("\r", 1)[-1]
    assert "2/3" in second and "loss=4.5000" in second, second
    bar.close()


def test_off_a_terminal_there_is_no_bar_but_a_plain_line_every_n_steps() -> None:
    out = io.StringIO()  # a log file: not a terminal
    progress = Progress(total=5, start=0, enabled=True, every=2, out=out)
    for step in range(1, 6):
        progress.update(stats(step, 6.0 - step, mfu=0.123 if step == 4 else None))
    progress.close()
    text = out.getvalue()
    assert "\r" not in text and "it/s" not in text, repr(text)
    lines = text.splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        "truestep train: step 2/5",
        "truestep train: step 4/5",
        "truestep train: step 5/5",  # the last step is always said
    ]
    assert lines[1] == (
        "truestep train: step 4/5 | loss 2.0000 | lr 0.0003 | grad norm 1.500 | 100 tok/s | peak mem 1.00 GiB"
        " | mfu 12.3%"
    )
    assert "mfu" not in lines[0]  # no known peak: no MFU claimed


def test_lines_can_be_switched_off_and_other_ranks_say_nothing() -> None:
    for kwargs in ({"enabled": True, "lines": False}, {"enabled": False}):
        out = io.StringIO()
        progress = Progress(total=2, start=0, every=1, out=out, **kwargs)  # type: ignore[arg-type]
        progress.update(stats(1, 1.0))
        progress.close()
        assert out.getvalue() == "", kwargs
    out = Terminal()
    progress = Progress(total=2, start=0, enabled=True, every=1, bar=False, out=out)
    progress.update(stats(1, 1.0))
    assert out.getvalue().startswith("truestep train: step 1/2 | loss 1.0000"), "no bar asked: lines"
