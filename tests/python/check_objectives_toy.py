#!/usr/bin/env python3
"""bench.objectives_toy's check: the objectives' bench run at toy size (a flow teacher trained
for a few hundred steps, a 2-step trajectory student, a 2-step dmd student) must leave a
trajectory student closer to the guided teacher than the teacher itself at the student's k steps
(`teacher_at_k`), by paired error on held-out noise, and a dmd student whose samples are closer
to the guided teacher's distribution than teacher_at_k's, by Fréchet distance. Nothing else is
asserted: the numbers that matter are the bench's, at full size.

usage: check_objectives_toy.py SUMMARY_JSON
"""

import json
import sys


def main():
    summary = json.load(open(sys.argv[1]))
    rows = summary["rows"]
    at_k = rows["teacher_at_k"]["paired_rel_mse"]
    curve = summary["trajectory_curve"]
    if not curve:
        print("FAIL: no trajectory student was evaluated")
        return 1
    student = curve[-1]["paired_rel_mse"]
    print(f"k = {summary['k']}: teacher_at_k paired rel MSE {at_k:.4f}, trajectory student {student:.4f} "
          f"({student / at_k:.2f}x) after {curve[-1]['trajectories']} trajectories")
    if not student < at_k:
        print("FAIL: the trajectory student does not beat the teacher at its k steps")
        return 1
    dmd = summary.get("dmd_curve", [])
    if not dmd:
        print("FAIL: no dmd student was evaluated")
        return 1
    at_k_frechet = rows["teacher_at_k"]["frechet"]
    last = dmd[-1]["frechet"]
    print(f"k = {summary['k']}: teacher_at_k Fréchet {at_k_frechet:.4f}, dmd student {last:.4f} after "
          f"{dmd[-1]['step']} critic steps (floor {summary['frechet_floor']:.4f})")
    if not last < at_k_frechet:
        print("FAIL: the dmd student's samples are not closer to the teacher's distribution than teacher_at_k's")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
