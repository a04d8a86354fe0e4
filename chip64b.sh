#!/bin/bash
export PYTHONUNBUFFERED=1 DITAX_SETUP=minimal
T0=$(date +%s)
source benchmarks/tpu_setup.sh > $OUT/setup.log 2>&1
echo "setup $(( $(date +%s) - T0 )) s"
timeout 170 python3 benchmarks/tpu_sweep.py --part wan_fused --out $OUT/wanfused.jsonl --budget-s 100 --repeats 5 2>&1 | grep '"case"' | cut -c1-330
echo "done $(( $(date +%s) - T0 )) s"
