"""The readable chaos report: the verdict first, then what was done to the cluster."""

from __future__ import annotations

from typing import Any

from testing.chaos.takeovers import describe


def render(result: dict[str, Any]) -> str:
    ev = result["events"]
    fresh = result["freshness_s"]
    lines = [
        f"chaos run  seed {result['seed']}  store {result['store']}  "
        f"{result['ingestors']} ingestors  {result['clients']} clients  "
        f"load {result['load_s']} s  total {result['duration_s']} s",
        "",
        f"  events acknowledged   {ev['acked']:>10,}",
        f"  not acknowledged      {ev['unacked']:>10,}   (stored anyway: "
        f"{ev['unacked_but_stored']:,}, allowed at most once)",
        *([f"  acknowledged by       {_pairs(result['acked_by_transport'])}"]
          if result.get("acked_by_transport") else []),
        f"  rows committed        {ev['committed_rows']:>10,}",
        f"  lost                  {ev['lost']:>10,}",
        f"  duplicated            {ev['duplicates']:>10,}",
        f"  never sent            {ev['phantoms']:>10,}",
        f"  throughput            {result['throughput_events_per_s']:>10,.0f} acked events/s",
        f"  freshness p50 / p99   {_s(fresh['all']['p50'])} / {_s(fresh['all']['p99'])}   "
        f"during faults {_s(fresh['during_faults']['p50'])} / "
        f"{_s(fresh['during_faults']['p99'])}",
        "",
        "  faults injected       " + _pairs(result["faults_injected"]),
        "  kills (-9)            " + _pairs(result["kills"]),
        f"  collector changes     {result['takeovers']} (kills with restart, takeovers)",
        *(["  standby takeovers     " + ", ".join(
            f"{seconds:.1f} s" + (" (store faults)" if faulty else "")
            for seconds, faulty in zip(result["standby_takeover_s"],
                                       result["standby_takeover_store_faults"], strict=True))
           + " from kill -9 to active"] if result.get("standby") else []),
        *(["  collector changes, kill (or epoch bump) to first commit:",
           *describe(result["collector_changes"])] if result.get("collector_changes") else []),
        "  process exits         " + _pairs(result["process_exits"]),
        f"  failed starts         {result.get('failed_starts', 0)} (retried, as a supervisor "
        "would)",
        "  client answers        " + _pairs(result["client_statuses"]),
        "",
    ]
    for name, passed in result["checks"].items():
        lines.append(f"  [{'ok' if passed else 'FAIL'}] {name}")
    if result["lost_ids"]:
        lines.append(f"  lost ids: {', '.join(result['lost_ids'][:20])}")
    if result["duplicate_ids"]:
        shown = [f"{i} (sequences {s})" for i, s in list(result["duplicate_ids"].items())[:20]]
        lines.append(f"  duplicated ids: {', '.join(shown)}")
    if result["phantom_ids"]:
        lines.append(f"  never-sent ids: {', '.join(result['phantom_ids'][:20])}")
    if result["refused_valid_requests"]:
        lines.append(f"  refused: {result['refused_valid_requests']}")
    lines.append("")
    lines.append("PASS: nothing lost, nothing duplicated" if result["ok"] else "FAIL")
    return "\n".join(lines)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _pairs(counts: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
