"""The CPU time a process spends in the scoring products, for the benchmarks of this folder."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


@contextlib.contextmanager
def scoring_clock() -> Iterator[dict[str, float]]:
    """While open, every ``score_models`` call and every owner's product of laid-out weights
    (``VectorEvaluator.score_laid_out``, one-layer models) is timed (CPU) around the original;
    the yielded dict's ``"seconds"`` adds them up (a caller may reset it to 0)."""
    from dfedrw.peer.learning import model_matrix as training
    clock = {"seconds": 0.0}
    original, laid_out = training.score_models, training.VectorEvaluator.score_laid_out

    def timing(function):
        def timed(*a, **k):
            start = time.process_time()
            try:
                return function(*a, **k)
            finally:
                clock["seconds"] += time.process_time() - start

        return timed

    training.score_models = timing(original)
    training.VectorEvaluator.score_laid_out = timing(laid_out)
    try:
        yield clock
    finally:
        training.score_models, training.VectorEvaluator.score_laid_out = original, laid_out
