"""Run every dev/cuda script (each checks its kernels against the NumPy reference and times them)
and end with a summary; the exit status is non-zero if any check failed or any script broke.

    python3 dev/cuda/run_all.py            # ANDREA-12M and ANDREA-120M shapes (needs CuPy and a GPU)
    python3 dev/cuda/run_all.py --quick    # ANDREA-tiny shapes only: a minute or so
    python3 dev/cuda/run_all.py --only attention_mma layernorm

Each script runs in a process of its own (a kernel that faults takes its CUDA context down, not
the rest) and leaves its rows in a JSON file that the summary reads.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEV = Path(__file__).resolve().parent
SCRIPTS = ("embedding", "layernorm", "attention", "attention_mma", "attention_wgmma", "classifier", "elementwise", "decode", "sampling", "fp8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small shapes only (ANDREA-tiny, B=2) and the edge cases")
    ap.add_argument("--reps", type=int, default=20, help="timed runs per version (median reported; default 20)")
    ap.add_argument("--only", nargs="+", choices=SCRIPTS, metavar="SCRIPT", help=f"run only these ({', '.join(SCRIPTS)})")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per script before it counts as failed (default 1800)")
    args = ap.parse_args(argv)

    summary = []
    with tempfile.TemporaryDirectory(prefix="dev_cuda_") as tmp:
        for name in args.only or SCRIPTS:
            out = Path(tmp) / f"{name}.json"
            cmd = [sys.executable, str(DEV / f"{name}.py"), "--json", str(out), "--reps", str(args.reps)]
            cmd += ["--quick"] if args.quick else []
            print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
            t0 = time.perf_counter()
            try:
                rc = subprocess.run(cmd, timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            seconds = time.perf_counter() - t0
            rows = json.loads(out.read_text())["rows"] if out.exists() else []
            failed = [r for r in rows if not r["ok"]]
            summary.append((name, rows, failed, rc, seconds))

    print("\n=== summary (dev/cuda)")
    print("| script | rows | failed | exit | seconds |")
    print("|---|---|---|---|---|")
    for name, rows, failed, rc, seconds in summary:
        print(f"| {name} | {len(rows)} | {len(failed)} | {rc} | {seconds:.0f} |")
    bad = False
    for name, rows, failed, rc, _ in summary:
        if rc != 0 or failed or not rows:
            bad = True
            print(f"{name}: exit {rc}" + ("" if rows else ", no result rows"))
        for r in failed:
            print(f"  FAILED {r['op']} / {r['version']} / {r['precision']} / {r['shape']}: err/tol {r['ratio']} {r['note']}")
    print("all checks passed" if not bad else "SOME CHECKS FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
