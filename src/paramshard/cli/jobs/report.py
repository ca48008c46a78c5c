"""`paramshard report`: plots and an index.html of a run directory."""
from __future__ import annotations

HELP = ("say a run's result (or its error), and draw its metrics as PNG plots and an index.html (works on a "
        "run still going); given a delta directory, its publishing and its serving replicas' freshness")
EXAMPLE = ("paramshard report runs/20261123-181500-ab12cd", "paramshard report runs/deltas")


def add_arguments(p):
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="a run directory of `paramshard launch` (the one holding metrics.jsonl), or a delta "
                        "directory (`launch --deltas DIR`: its figures and replicas are printed, no page)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="folder for the PNGs and index.html (default: RUN_DIR/report)")


def run(args) -> int:
    # Imported here: `paramshard --help` and the other commands need not load matplotlib.
    from paramshard.observe.report.deltas_view import delta_dir_lines, is_delta_dir, run_lines
    from paramshard.observe.report.geo_section import geo_lines
    from paramshard.observe.report.report_files import write_report
    from paramshard.observe.report.run_result import result_lines
    from paramshard.observe.run_records.run_data import load_run

    if is_delta_dir(args.run_dir):
        for line in delta_dir_lines(args.run_dir):
            print(line)
        return 0
    # First the run's result (or its error), its deltas and replicas, its GEO rounds, then where the page is (the last line).
    run = load_run(args.run_dir)
    for line in result_lines(run) + run_lines(run) + geo_lines(run):
        print(line)
    print(write_report(args.run_dir, args.out, run=run))
    return 0
