"""The simulator: every placement goes through a registered policy's `place()` (the same
code path as the controller); nothing here places pods itself.

* `openb` — the Alibaba openb trace under the FGD paper's protocol (one-pod gangs);
* `study` — many openb runs in a process pool, aggregated like the paper's table;
* `replay` — a seeded multi-tenant heterogeneous gang replay (Kueue-like queueing,
  departures, fabric locality slowdown, cost);
* `stats` — seed-paired differences with 95 % intervals (ahead / behind / within noise);
* `report` — Markdown + PNG + JSON.
"""
