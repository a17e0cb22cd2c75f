"""OTLP decode and mapping per span, of the tree this runs from or another checkout's.

    python benchmarks/otlp_ab.py SERVICES_DIR      (e.g. after git archive REV services | tar -x -C /tmp/old)

Puts ``SERVICES_DIR`` first on ``sys.path`` (so run it in turn with the old and the new
tree, in one shell, for a before/after), and prints microseconds of CPU per span, best of
5, over both corpora of ``benchmarks.bench_otlp``: ``decode`` (``decode_request``),
``map`` (``map_spans`` of decoded spans) and ``bridge`` (decode, map and the raw topic's
bytes: what the bridge stage computes, ``bench_otlp._bridge_bytes``).
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path


def main(services: str) -> None:
    sys.path.insert(0, services)
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
    import stepstream
    from benchmarks.bench_otlp import _bridge_bytes, agent_corpus, corpus
    from stepstream.otlp.decode import decode_request
    from stepstream.otlp.identity import IdentityPolicy
    from stepstream.otlp.trace import map_spans

    assert stepstream.__file__.startswith(services), stepstream.__file__
    policy = IdentityPolicy(default_company="acme")
    cells = []
    for name, (protos, _, spans) in (("agent", agent_corpus(200)), ("fixtures", corpus(1000))):
        decoded = [decode_request(data).spans for data in protos]

        def bridge() -> None:
            for data in protos:
                _bridge_bytes(map_spans(decode_request(data).spans, None, policy))

        def best(work) -> float:
            seconds = float("inf")
            for _ in range(5):
                start = time.process_time()
                work()
                seconds = min(seconds, time.process_time() - start)
            return seconds / spans * 1e6

        gc.collect()
        gc.freeze()
        decode = best(lambda: [decode_request(data) for data in protos])
        mapping = best(lambda: [map_spans(s, None, policy) for s in decoded])
        cells.append(f"{name}: decode {decode:.1f} map {mapping:.1f} bridge {best(bridge):.1f}")
        gc.unfreeze()
    print(services, " | ".join(cells))


if __name__ == "__main__":
    main(sys.argv[1])
