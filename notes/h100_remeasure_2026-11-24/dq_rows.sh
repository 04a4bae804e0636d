#!/usr/bin/env bash
# Every variant of dq_rows.py compiled side by side (Triton's cache), then timed one after another.
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
P=notes/h100_remeasure_2026-11-24/dq_rows.py
V64='[(False,None),(True,(128,64,8,2)),(True,(128,32,8,2)),(True,(64,64,4,2)),(True,(128,64,8,3)),(False,None)]'
V128='[(False,None),(True,(64,32,4,2)),(True,(64,64,4,1)),(True,(64,32,8,2)),(True,(64,64,8,2)),(False,None)]'
V11='[(False,None),(True,(64,32,4,1)),(True,(64,32,8,1))]'
runs=()
for i in 0 1 2 3 4 5; do runs+=("H=8 D=64 VARIANTS='$V64' VARIANT=$i"); done
for i in 0 1 2 3 4 5; do runs+=("H=16 D=128 VARIANTS='$V128' VARIANT=$i"); done
for i in 0 1 2; do runs+=("H=16 D=128 CQ=11 CK=11 VARIANTS='$V11' VARIANT=$i"); done
start=$(date +%s)
for r in "${runs[@]}"; do (eval "COMPILE_ONLY=1 $r python3 $P" 2>&1 | grep -v -i warn || echo "FAILED: $r") & done
wait
echo "compiled side by side in $(( $(date +%s) - start )) s"
for r in "${runs[@]}"; do eval "$r python3 $P" 2>&1 | grep -v -i warn || echo "FAILED: $r"; done
echo "all in $(( $(date +%s) - start )) s"
