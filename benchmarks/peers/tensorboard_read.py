"""Reads a cohort TensorBoard log directory with TensorBoard's own event loader and compares its epoch
scalars with the run's history CSV (float32 rounding apart), and checks a histogram per variable and epoch.
    usage: tensorboard_read.py LOG_DIR HISTORY_CSV
Exit status 1 on any difference."""
import csv
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

log_dir, history_csv = sys.argv[1], sys.argv[2]
with open(history_csv) as f:
    history = list(csv.DictReader(f))
runs = {}
for run in ("train", "validation"):
    accumulator = EventAccumulator(f"{log_dir}/{run}", size_guidance={"scalars": 0, "histograms": 0})
    accumulator.Reload()
    runs[run] = accumulator
problems = []
compared = 0
for row in history:
    epoch = int(row["epoch"]) - 1  # the CSV counts from 1, TensorBoard's steps are epoch indices
    for column, text in row.items():
        if column == "epoch" or text == "":
            continue
        run, tag = ("validation", "epoch_" + column[4:]) if column.startswith("val_") else ("train", "epoch_" + column)
        events = [e for e in runs[run].Scalars(tag) if e.step == epoch] if tag in runs[run].Tags()["scalars"] else []
        if len(events) != 1:
            problems.append(f"{run}/{tag} at step {epoch}: {len(events)} events")
            continue
        expected = float(text)
        if abs(events[0].value - expected) > 1e-5 * max(1.0, abs(expected)):
            problems.append(f"{run}/{tag} at step {epoch}: {events[0].value} in the event file, {expected} in the CSV")
        compared += 1
histograms = runs["train"].Tags()["histograms"]
for tag in histograms:
    steps = [e.step for e in runs["train"].Histograms(tag)]
    if steps != list(range(len(history))):
        problems.append(f"histogram {tag}: steps {steps}")
    if any(e.histogram_value.num <= 0 for e in runs["train"].Histograms(tag)):
        problems.append(f"histogram {tag}: empty")
print(f"TensorBoard {__import__('tensorboard').__version__} read {compared} epoch scalars equal to the CSV's, "
      f"{len(histograms)} variables' histograms over {len(history)} epochs, "
      f"batch scalars: {', '.join(t for t in runs['train'].Tags()['scalars'] if t.startswith('batch_')) or 'none'}")
if not histograms:
    problems.append("no histograms")
for p in problems:
    print("  mismatch:", p)
sys.exit(1 if problems else 0)
