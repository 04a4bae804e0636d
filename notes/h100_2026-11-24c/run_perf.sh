# One device call: the int64 offsets' cost (old and new code, alternating, compiled side by side first), then
# the d = 128 keys-as-rows dK/dV tiles.
export PYTHONUNBUFFERED=1
S=notes/h100_2026-11-24c/int64_offsets_cost.py
PYTHONPATH=zz_old:. python $S warm-old > /dev/null 2>&1 &
PYTHONPATH=. python $S warm-new > /dev/null 2>&1 &
wait
for round in 1 2; do
  PYTHONPATH=zz_old:. python $S old 2>&1 | grep -v Warn
  PYTHONPATH=. python $S new 2>&1 | grep -v Warn
done
echo "int64 part done at $SECONDS s"
bash notes/h100_2026-11-24c/run_d128.sh
