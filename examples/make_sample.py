"""Generate ``examples/turns.jsonl``: a deterministic sample of completed turns for ``throughline ingest``.

    python examples/make_sample.py                 # rewrites examples/turns.jsonl
    python examples/make_sample.py --out - | head  # print instead
    python examples/make_sample.py --check         # exit 1 if the committed file is stale

The sample has three projects, four hosts and several threads per project, in one interleaved
stream with increasing ``completedAt``:

- thread switches inside a project (a host works on two threads in turn);
- a host switch: ``/srv/agents/billing-service`` moves from ``laptop-aiko`` to ``ci-runner-07``;
- a rollback: thread ``refactor-ledger`` rewinds to seq 4 after reaching 7 (turns 4..7 are replaced);
- explicit ``seq`` on some turns, none on others (then the turn appends);
- multi-line and non-ASCII bodies (Japanese, accents, emoji), and one ~100 KB body (a long test log)
  that the reader must cut to its bound while keeping the turn.

Only a ``random.Random`` with a fixed seed is used, so the output is byte-for-byte stable.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

SEED = 20260115
DEFAULT_OUT = Path(__file__).with_name("turns.jsonl")
START = datetime(2026, 1, 15, 9, 0, 0, tzinfo=UTC)
TOKYO = timezone(timedelta(hours=9))
NEW_YORK = timezone(timedelta(hours=-5))

PROMPTS = [
    "Run the unit tests for the ledger module.",
    "Why does the nightly export take 40 minutes now?",
    "Rename `post_entry` to `record_entry` everywhere.",
    "Add a retry with backoff around the payment gateway call.",
    "Summarise the open review comments on PR #482.",
    "Draft release notes for 2.7.0.",
    "Check that the migration is reversible.",
    "Which services still read the legacy `accounts_v1` table?",
    "Pin the terraform provider to 5.31 and plan again.",
    "Explain the drift in the staging VPC.",
]
ANSWERS = [
    "All 214 tests pass. Two are skipped because they need the sandbox gateway.",
    "The export now joins `invoices` without an index on `issued_at`; adding it brings the run back to ~6 min.",
    "Done: 37 call sites in 12 files. I left the public alias `post_entry` with a deprecation warning.",
    "Added exponential backoff (3 tries, 200 ms base, jitter) and a test that simulates two 503s.",
    "Three threads are open: naming of `LedgerLine`, a missing test for refunds, and the log level.",
    "The migration has a matching `downgrade()`; I ran up/down/up on a copy of staging.",
    "Only `reporting-worker` and the quarterly `audit_export` job still read it.",
    "Plan: 0 to add, 2 to change, 0 to destroy. The changes are tag updates on two subnets.",
    "Someone added an ingress rule by hand on 2026-01-12; terraform wants to remove it.",
]
NON_ASCII = [
    "テストはすべて通りました。ただし `refund` のケースが一件スキップされています。",
    "Résumé : la migration est réversible, vérifiée deux fois ✓",
    "Der Export läuft jetzt in 6 Minuten statt 40 — Index auf `issued_at` hinzugefügt.",
    "Listo 🎉 — el despliegue en staging terminó sin errores.",
    "差分は2件だけです：サブネットのタグ更新。破棄はありません。",
    "Готово: переименовано 37 вызовов, тесты зелёные.",
]
CODE_SNIPPETS = [
    "Here is the fix:\n\n```python\ndef record_entry(ledger, entry):\n    ledger.append(entry)\n    return entry.id\n```\n",
    'Plan output:\n\n```\n~ aws_subnet.private_a\n    tags.Owner: "infra" => "platform"\n~ aws_subnet.private_b\n    tags.Owner: "infra" => "platform"\n```',
    "Steps:\n1. add the index\n2. backfill statistics\n3. re-run the export\n\nEach step is idempotent.",
    "```sql\nCREATE INDEX CONCURRENTLY invoices_issued_at_idx ON invoices (issued_at);\n```\nRun it outside a transaction.",
]


@dataclass
class Thread:
    project: str
    host: str
    name: str
    length: int = 0
    next_id: int = 1
    ids: list[str] = field(default_factory=list)

    def new_turn_id(self) -> str:
        turn_id = f"{self.name}-{self.next_id:04d}"
        self.next_id += 1
        return turn_id


def big_log(rng: random.Random, target_bytes: int = 100_000) -> str:
    """A long, realistic test log (about ``target_bytes`` UTF-8 bytes), ending with a summary."""
    lines = ["Full output of `pytest -vv tests/` as requested:", ""]
    size = sum(len(x) + 1 for x in lines)
    n = 0
    while size < target_bytes - 200:
        n += 1
        module = rng.choice(["ledger", "payments", "export", "refunds", "accounts", "audit"])
        outcome = "PASSED" if rng.random() > 0.01 else "SKIPPED"
        line = f"tests/test_{module}.py::test_case_{n:05d}[param-{rng.randrange(1000):03d}] {outcome} [{n % 100:3d}%]"
        lines.append(line)
        size += len(line) + 1
    lines += ["", f"===== {n} collected, all passed or skipped in 312.45s (0:05:12) ====="]
    return "\n".join(lines)


def body_for(rng: random.Random, kind: str) -> str:
    if kind == "prompt":
        return rng.choice(PROMPTS)
    roll = rng.random()
    if roll < 0.18:
        return rng.choice(NON_ASCII)
    if roll < 0.35:
        return rng.choice(CODE_SNIPPETS)
    return rng.choice(ANSWERS)


def generate(seed: int = SEED, turns: int = 320) -> list[dict[str, object]]:
    """The sample turns, in log order."""
    rng = random.Random(seed)
    billing, notes, infra = "/srv/agents/billing-service", "/home/aiko/プロジェクト/notes", "/work/infra/terraform/"
    threads = {
        "refactor-ledger": Thread(billing, "laptop-aiko", "refactor-ledger"),
        "export-perf": Thread(billing, "laptop-aiko", "export-perf"),
        "daily-notes": Thread(notes, "tablet-aiko", "daily-notes"),
        "translations": Thread(notes, "tablet-aiko", "translations"),
        "drift": Thread(infra, "ci-runner-07", "drift"),
        "provider-pin": Thread(infra, "build-agent-3", "provider-pin"),
    }
    order = list(threads)
    out: list[dict[str, object]] = []
    moment = START
    current = "refactor-ledger"
    rolled_back = host_switched = big_done = False
    for i in range(turns):
        # Mostly keep working on the same thread; sometimes switch (inside or across projects).
        if i > 0 and rng.random() < 0.3:
            current = rng.choice(order)
        thread = threads[current]
        seq: int | None = None
        if not rolled_back and thread.name == "refactor-ledger" and thread.length >= 7:
            seq = 4  # a rollback: the host rewinds the thread to seq 4 and continues from there
            thread.length = 3
            rolled_back = True
        elif rng.random() < 0.35:
            seq = thread.length + 1  # an explicit seq that simply appends
        if not host_switched and i >= turns // 2 and thread.project == billing:
            # The billing work moves from the laptop to CI: a new source for the same project.
            for name in ("refactor-ledger", "export-perf"):
                old = threads[name]
                threads[name] = Thread(billing, "ci-runner-07", name, next_id=old.next_id)
            thread = threads[current]
            seq = None
            host_switched = True
        kind = "prompt" if thread.length % 2 == 0 else "answer"
        body = body_for(rng, kind)
        if not big_done and i >= turns // 3 and kind == "answer" and thread.project == billing:
            body = big_log(rng)
            big_done = True
        moment += timedelta(seconds=rng.randrange(2, 120), microseconds=rng.randrange(1_000_000))
        zone = rng.choice([UTC, UTC, UTC, TOKYO, NEW_YORK])
        local = moment.astimezone(zone)
        stamp = local.isoformat(timespec="milliseconds" if rng.random() < 0.5 else "microseconds")
        stamp = stamp.replace("+00:00", "Z")
        turn: dict[str, object] = {
            "project": thread.project,
            "host": thread.host,
            "thread": thread.name,
            "turnId": thread.new_turn_id(),
            "completedAt": stamp,
            "body": body,
        }
        if seq is not None:
            turn["seq"] = seq
        thread.length = seq if seq is not None else thread.length + 1
        out.append(turn)
    assert rolled_back and host_switched and big_done, "the sample lost one of its features; change the seed"
    return out


def render(turns: list[dict[str, object]]) -> str:
    """JSON Lines text of the turns (UTF-8, not ASCII-escaped, stable key order)."""
    return "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in turns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output file, or - for stdout")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--turns", type=int, default=320)
    parser.add_argument("--check", action="store_true", help="exit 1 when --out differs from what would be written")
    args = parser.parse_args(argv)
    text = render(generate(args.seed, args.turns))
    if args.check:
        current = Path(args.out).read_text("utf-8") if Path(args.out).exists() else ""
        if current != text:
            print(f"{args.out} is stale: run python examples/make_sample.py", file=sys.stderr)
            return 1
        return 0
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, "utf-8")
        print(f"wrote {len(text.splitlines())} turns to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
