#!/usr/bin/env python3
"""Step time and exposed communication of one process of a cohort timeline (--timeline FILE).

A step runs from one "wait for batch" to the one after its update on the process's main thread (with
gradient accumulation, --accumulate K passes make one step); its exposed communication is the time its main
thread spent in "communication" events (waiting for an allreduce, pushing to and reading from parameter
servers), which backward did not hide. The first steps (warm-up) and steps that include a validation pass
(an epoch's end) are left out. Prints:
    steps=N step_ms=X exposed_comm_ms=Y exposed_share=Z
    usage: timeline_summary.py TRACE [--process NAME] [--skip N] [--accumulate K]
"""
import argparse
import json
import statistics
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--process", default=None, help="the track's process name (default: the first)")
    parser.add_argument("--skip", type=int, default=3, help="warm-up steps left out")
    parser.add_argument("--accumulate", type=int, default=1, help="passes per update (--accumulate-steps)")
    args = parser.parse_args()
    events = json.load(open(args.trace))["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    named = [p for p, n in processes.items() if n == args.process]
    if args.process is not None and not named:
        sys.exit(f"{args.trace}: no process named '{args.process}' (there are: {', '.join(sorted(processes.values()))})")
    pid = min(processes) if args.process is None else named[0]
    main_tid = next(e["tid"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
                    and e["pid"] == pid and e["args"]["name"] == "main")
    mine = [e for e in events if e.get("ph") == "X" and e["pid"] == pid and e["tid"] == main_tid]
    starts = sorted(e["ts"] for e in mine if e["name"] == "wait for batch")[::args.accumulate]
    communication = [e for e in mine if e["cat"] == "communication"]
    validation = [e["ts"] for e in mine if e["cat"] == "inference"]
    steps, exposed = [], []
    for begin, end in list(zip(starts, starts[1:]))[args.skip:]:
        if any(begin <= t < end for t in validation):
            continue
        steps.append(end - begin)
        exposed.append(sum(e["dur"] for e in communication if begin <= e["ts"] < end))
    if not steps:
        sys.exit(f"{args.trace}: fewer than {args.skip + 2} steps on the timeline of {processes[pid]}")
    step_ms = statistics.mean(steps) / 1000
    comm_ms = statistics.mean(exposed) / 1000
    print(f"steps={len(steps)} step_ms={step_ms:.1f} exposed_comm_ms={comm_ms:.1f} exposed_share={comm_ms / step_ms:.3f}")


if __name__ == "__main__":
    main()
