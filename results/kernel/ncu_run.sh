#!/usr/bin/env bash
# One run on a lent H200: ncu_probe.py's hardware counters for one fwd+bwd of ours and of SDPA
# at each shape of SHAPES ("D,T,H,B;D,T,H,B", as the other probes take it; default: the
# benchmark's 4096- and 16384-token shapes). Writes ncu_setup.log, ncu.log (every launch),
# ncu_sums.log (each kernel's launches summed) and ncu_csv.tar.gz (ncu's raw output,
# ncu_<impl>_D<D>_T<T>_H<H>_B<B>.csv) under $OUT.
# TREE: the commit whose tree runs (a copied working tree may carry older git metadata).
set -o pipefail
command -v ncu >/dev/null || PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ | tail -n 1)
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 4
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  ncu --version | tail -n 1
  echo "tree of commit ${TREE:-unknown}"
} | tee "$OUT/ncu_setup.log"
metrics=$(python3 results/kernel/ncu_probe.py metrics)
echo "counters: $metrics" | tee -a "$OUT/ncu_setup.log"
ncu --query-metrics | grep -E "ops_path_tensor|pipe_tensor" >>"$OUT/ncu_setup.log"
csvs=$(mktemp -d)
IFS=';' read -ra shapes <<<"${SHAPES:-64,4096,32,4;128,4096,16,4;64,16384,32,1;128,16384,16,1}"
for shape in "${shapes[@]}"; do
  IFS=, read -r D T H B <<<"$shape"
  for impl in ours sdpa; do
    timeout 200 ncu --clock-control none --profile-from-start off --print-units base \
      --metrics "$metrics" --csv --page raw --log-file "$csvs/ncu_${impl}_D${D}_T${T}_H${H}_B${B}.csv" \
      python3 results/kernel/ncu_probe.py run "$impl" "$D" "$T" "$H" "$B" >>"$OUT/ncu_setup.log" 2>&1
    echo "$impl D=$D T=$T exit $? at ${SECONDS}s" | tee -a "$OUT/ncu_setup.log"
  done
done
tar -czf "$OUT/ncu_csv.tar.gz" -C "$csvs" .
python3 results/kernel/ncu_probe.py table "$csvs"/ncu_*.csv | tee "$OUT/ncu.log"
python3 results/kernel/ncu_probe.py sums "$csvs"/ncu_*.csv | tee "$OUT/ncu_sums.log"
