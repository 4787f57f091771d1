"""The progress bar shows the loss of the step it counts (issue 24: it showed the previous step's)."""

from __future__ import annotations

from truestep.telemetry.progress import Progress


def test_the_bar_shows_the_loss_of_the_step_it_just_counted(capsys) -> None:
    bar = Progress(total=3, start=0, enabled=True, every=1)
    bar.bar.mininterval = 0  # draw at every update (tqdm otherwise skips redraws within 0.1 s)
    bar.update(1, 5.25, 100.0)
    first = capsys.readouterr().err.rsplit("\r", 1)[-1]
    assert "1/3" in first and "loss=5.2500" in first, first
    bar.update(2, 4.5, 100.0)
    second = capsys.readouterr().err.rsplit("\r", 1)[-1]
    assert "2/3" in second and "loss=4.5000" in second, second
    bar.close()
