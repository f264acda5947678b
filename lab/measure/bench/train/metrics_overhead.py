"""What the Prometheus exporter costs a training step: exporter on vs off, interleaved.

    lab bench metrics-overhead --config smoke --rounds 3 --steps 20

One process trains; blocks of steps alternate (ABBA) between "on" (the exporter hook updates
its gauges at every log interval and a scraper fetches /metrics every
`--scrape-interval` seconds, as Prometheus would) and "off" (no hook, no scraper).
Interleaving gives both the same machine; the ratio of mean block times is the
overhead. Goal: at most 1% (ratio <= 1.01).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import urllib.request
from typing import Any


def run(args: argparse.Namespace) -> int:
    from lab.measure.bench.train import harness
    from lab.run import config
    from lab.run.observability import metrics
    from lab.run.training import runs

    cfg = config.load(args.config or "smoke", args.overrides)
    cfg = config.with_overrides(cfg, data={"source": "synthetic"}, metrics={"port_base": 0})
    with harness.trainer_session(cfg) as (ctx, trainer, _):
        exporter = metrics.RankExporter(
            0, "127.0.0.1", {"run_id": "overhead", "rank": "0", "node": "local"}, ctx.device, {"lab_version": "bench"}
        )
        assert exporter.endpoint is not None  # a RankExporter serves from its constructor on
        scraper = _Scraper(exporter.endpoint, args.scrape_interval)
        batches = trainer.train_loader.forever()

        def block(exporter_on: bool) -> float:
            def train() -> None:
                for step in range(1, args.steps + 1):
                    trainer.train_step(*next(batches))
                    if step % cfg.train.log_every == 0:
                        trainer.flush_log()

            trainer.hooks = [exporter] if exporter_on else []
            scraper.active = exporter_on
            return harness.timed(ctx, train)

        block(False)  # warm-up
        on: list[float] = []
        off: list[float] = []
        for exporter_on in harness.abba(args.rounds):
            (on if exporter_on else off).append(block(exporter_on))
        scraper.stop()
        exporter.close()
    result = summarize(on, off, args, scraper.count, scraper.failures)
    print(render(result), flush=True)
    if args.json:
        runs.write_json(args.json, result)
    return 0


def summarize(
    on: list[float], off: list[float], args: argparse.Namespace, scrapes: int, failures: int
) -> dict[str, Any]:
    ratio = statistics.mean(on) / statistics.mean(off)
    return {
        "benchmark": "metrics-overhead",
        "rounds": args.rounds,
        "steps_per_block": args.steps,
        "scrape_interval_seconds": args.scrape_interval,
        "block_seconds_on": on,
        "block_seconds_off": off,
        "ratio_on_over_off": ratio,
        "overhead": ratio - 1,
        "scrapes": scrapes,
        "scrape_failures": failures,
        "goal_met": ratio <= 1.01,
    }


def render(r: dict[str, Any]) -> str:
    lines = ["| block | exporter on (s) | exporter off (s) |", "|---:|---:|---:|"]
    lines += [
        f"| {i} | {a:.3f} | {b:.3f} |" for i, (a, b) in enumerate(zip(r["block_seconds_on"], r["block_seconds_off"]), 1)
    ]
    lines.append(
        f"exporter on / off: {r['ratio_on_over_off']:.4f} (overhead {r['overhead']:+.2%}; goal <= +1%: "
        f"{'met' if r['goal_met'] else 'missed'}); {r['scrapes']} scrapes, {r['scrape_failures']} failed"
    )
    return "\n".join(lines)


class _Scraper:
    """Fetches /metrics every `interval` seconds while `active`, like a Prometheus server."""

    def __init__(self, url: str, interval: float) -> None:
        self.url, self.interval, self.active = url, interval, False
        self.count = self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if self.active:
                try:
                    with urllib.request.urlopen(self.url, timeout=5) as response:
                        response.read()
                    self.count += 1
                except OSError:
                    self.failures += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
