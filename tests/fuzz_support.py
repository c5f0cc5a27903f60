"""What the property tests share (pytest puts tests/ on sys.path): the hypothesis settings, whose case count
``WB_FUZZ_EXAMPLES`` sets (default 300; the GPU run uses 1000), and a tally of each test's outcomes, printed at the
end of its module so that a run's log says how many cases ran and how they ended."""

from __future__ import annotations

import collections
import os

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("WB_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Tally:
    """Outcomes per test: ``tally.count("expand_page_indices", "refused: block_table has strides")``."""

    def __init__(self) -> None:
        self.counts: collections.defaultdict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def count(self, test: str, outcome: str) -> None:
        self.counts[test][outcome] += 1

    def report(self) -> None:
        for test, c in self.counts.items():
            print(f"\n{test}: {c.total()} cases: {dict(c)}")
