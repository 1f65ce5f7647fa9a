"""dessim's DualPipe against DeepSeek's reference: the pass order its ``DualPipe.step`` runs
on every rank, and the README figure tick by tick (8 PP ranks, 20 micro-batches, unit
F = B = W, a whole backward two units, as the figure draws them).

The data (tests/data/dualpipe/dualpipe_pp8_mb20.txt) was recorded from deepseek-ai/DualPipe at
commit 3da1bbe: the order by running the reference's own ``dualpipe/dualpipe.py`` under
recording stand-ins for torch (record_reference.py), the figure by reading
``images/dualpipe.png`` pixel by pixel (transcribe_figure.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dessim.workload.transformer.schedules import PipeOp, _input_key, stage_program, unit_timeline

P, M = 8, 20
DATA = Path(__file__).parent / "data" / "dualpipe" / "dualpipe_pp8_mb20.txt"


def _lines(prefix: str) -> list[str]:
    rows = [line.split(": ", 1)[1] for line in DATA.read_text().splitlines() if line.startswith(prefix)]
    assert len(rows) == P
    return rows


def _token(op: PipeOp) -> str:
    """``op`` in the data file's notation: phase (I for a split backward), direction (the
    chunk: 0 enters at stage 0), micro-batch within its direction."""
    return f"{'I' if op.split else op.phase}{op.chunk}.{op.mb - op.chunk * M // 2}"


def _dessim_order(stage: int) -> list[str]:
    tokens: list[str] = []
    for op in stage_program("dualpipe", stage, P, M):
        if op.paired:
            tokens[-1] += "&" + _token(op)
        else:
            tokens.append(_token(op))
    return tokens


@pytest.mark.parametrize("rank", range(P))
def test_pass_order_is_the_reference_codes(rank):
    """Every pass, its direction and micro-batch, which backward passes are split (zero
    bubble) and which pairs are overlapped, in the order the reference executes them."""
    assert _dessim_order(rank) == _lines("rank")[rank].split()


def _figure_ops(row: str, timed) -> list[tuple[int, int]]:
    """The (start, end) cell of each of ``timed``'s passes in a figure row, walking both in
    order: a pass's cells must be the next non-idle cells and show its phase and direction."""
    cells = row.replace(" ", "")
    spans, c = [], 0
    for t in timed:
        length = int(t.end - t.start)
        letter = t.op.phase if t.op.chunk == 0 else t.op.phase.lower()
        while cells[c] == ".":
            c += 1
        assert cells[c:c + length] == letter * length, (t, cells[c:c + length])
        spans.append((c, c + length))
        c += length
    assert set(cells[c:]) <= {"."}
    return spans


def test_unit_timeline_reproduces_the_readme_figure():
    """Each pass starts at the figure's tick, except 36 of the cool-down's stand-alone
    backward passes (steps 5-6 of ``DualPipe.step``), which the figure draws one or two
    ticks later, after a bubble, where dessim starts them as soon as their input is there (as
    the reference code does: their ``_commit_and_wait_comm`` waits for nothing else). Both
    timelines respect every dependency, and every rank ends at the figure's tick."""
    figure = _lines("figure")
    timeline = unit_timeline("dualpipe", P, M)
    at_figure: dict[tuple[str, int, int, int], tuple[int, int]] = {}
    later = []
    for s, row in enumerate(timeline):
        spans = _figure_ops(figure[s], row)
        assert row[-1].end == spans[-1][1]                    # same end on every rank
        assert row[0].start == spans[0][0]
        for t, (start, end) in zip(row, spans):
            at_figure[(t.op.phase, s, t.op.chunk, t.op.mb)] = (start, end)
            if start != t.start:
                later.append(t)
                assert t.start < start <= t.start + 2
                assert t.op.phase == "B" and not t.op.paired
    assert len(later) == 36
    assert max(t.end for row in timeline for t in row) == 66
    # the figure's placement is a valid schedule too: every pass after its input
    for s, row in enumerate(timeline):
        for t in row:
            key = _input_key(s, t.op, P, 1, True)
            if key is not None:
                assert at_figure[key][1] <= at_figure[(t.op.phase, s, t.op.chunk, t.op.mb)][0]


def test_figure_borders_are_the_overlapped_pairs():
    """The figure encloses an overlapped F&B in one border (an orange and two green cells);
    the reference's ``overlapped_forward_backward`` calls are those pairs, rank by rank."""
    for rank, (order, row) in enumerate(zip(_lines("rank"), _lines("figure"))):
        pairs = [tok for tok in order.split() if "&" in tok]
        drawn = [g for g in row.split() if len(g.strip(".")) == 3 and g.strip(".")[0] in "Ff"]
        assert len(pairs) == len(drawn), rank
        for tok, cells in zip(pairs, drawn):
            f, b = tok.split("&")
            cells = cells.strip(".")
            assert (cells[0] == "F") == (f[1] == "0") and (cells[1] == "B") == (b[1] == "0")
