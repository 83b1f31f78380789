#!/usr/bin/env python3
"""Per-call inclusive instruction counts of the measured_* functions in a callgrind file.

Taken from main's call arcs (callgrind_annotate --tree=calling --inclusive=yes): the cost
of main -> measured_X (N calls) is everything executed inside those N calls.

usage: analyze.py <callgrind.out> [<callgrind.out with fewer iterations>]
With two files, also prints the steady-state cost per call from their difference
(removes one-time costs such as lazy PLT binding by ld.so)."""
import re, subprocess, sys

def num(s):
    return int(s.replace(",", ""))

def measure(path):
    out = subprocess.run(["callgrind_annotate", "--tree=calling", "--inclusive=yes", path],
                         capture_output=True, text=True, check=True).stdout
    arcs, callees, cur = {}, {}, None
    for line in out.splitlines():
        m = re.match(r"\s*[\d,]+ \([^)]*\)\s+\*\s+(\S+)", line)
        if m:
            fn = m.group(1).split(":")[-1]
            cur = fn if (fn == "main" or fn.startswith("measured_")) else None
            continue
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+>\s+(\S+) \(([\d,]+)x\)", line)
        if m and cur:
            callee = m.group(2).split(":")[-1]
            if cur == "main" and callee.startswith("measured_"):
                ir, n = arcs.get(callee, (0, 0))
                arcs[callee] = (ir + num(m.group(1)), n + num(m.group(3)))
            elif cur != "main":
                callees.setdefault(cur, {})
                ir, n = callees[cur].get(m.group(2), (0, 0))
                callees[cur][m.group(2)] = (ir + num(m.group(1)), n + num(m.group(3)))
    return arcs, callees

arcs, callees = measure(sys.argv[1])
print(f"{sys.argv[1]}:")
for f in sorted(arcs):
    ir, n = arcs[f]
    print(f"  {f:18s} {ir:>10,} Ir / {n:>6,} calls = {ir/n:8.3f} Ir per call")
    for name, (cir, cn) in sorted(callees.get(f, {}).items(), key=lambda kv: -kv[1][0]):
        print(f"      -> {name[-70:]:70s} {cir:>9,} Ir / {cn:>6,}x = {cir/cn:7.2f}")
if len(sys.argv) > 2:
    arcs2, _ = measure(sys.argv[2])
    print(f"  steady state from the difference with {sys.argv[2]}:")
    for f in sorted(arcs):
        if f in arcs2 and arcs[f][1] != arcs2[f][1]:
            d = (arcs[f][0] - arcs2[f][0]) / (arcs[f][1] - arcs2[f][1])
            print(f"  {f:18s} ({arcs[f][0]:,} - {arcs2[f][0]:,}) / ({arcs[f][1]:,} - {arcs2[f][1]:,}) = {d:.3f} Ir per call")
