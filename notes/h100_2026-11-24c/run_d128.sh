export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
S=notes/h100_2026-11-24c/dkdv_keys_as_rows_d128.py
TL=("(32, 64, 8, 1)" "(32, 64, 8, 2)" "(16, 64, 8, 1)" "(16, 64, 8, 2)" "(64, 64, 8, 1)")
for t in "${TL[@]}"; do ONLY_COMPILE=1 TILES="[$t]" python $S > /dev/null 2>&1 & done
ONLY_COMPILE=1 TILES="[]" python $S > /dev/null 2>&1 &
wait; echo "compiled at $SECONDS s"
i=0; for t in "${TL[@]}"; do i=$((i+1)); TAG=$i TILES="[$t]" timeout 120 python $S 2>&1 | grep -v Warn; done
echo "done at $SECONDS s"
