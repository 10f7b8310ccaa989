#!/usr/bin/env bash
# The largest batch that fits, one process per probe: a probe command that
# takes a last argument K (file batches concatenated into one batch) and
# exits 0 when that batch trains and 3 when it does not fit
# (engine_bench --probe K, bench_torch.py --probe K); any other exit status
# is an error that stops the search (exit 1). From K0 (a guess) the
# step grows by --factor (2: doubling) until a probe fails, or shrinks until
# one fits, then bisects between the largest K that fit and the smallest that
# failed, with at most --probes probes and until the --deadline (seconds
# since the epoch) has passed. Prints every probe and one summary line:
#   max_batch LABEL fits_k=A fails_k=B resolved=0|1 probes=N seconds=S
#
#   bench/e2e/max_batch.sh LABEL K0 FACTOR PROBES DEADLINE -- CMD [ARGS...]
set -uo pipefail
label="$1" k="$2" factor="$3" max_probes="$4" deadline="$5"
shift 5
[ "$1" = "--" ] && shift
start=$(date +%s)
lo=0 hi=0 n=0
probe() {  # probe K -> 0 fits, 1 does not
  n=$((n + 1))
  local t0 rc
  t0=$(date +%s.%N)
  "$@" "$k" >"/tmp/max_batch.$$.log" 2>&1
  rc=$?
  printf '%s k=%d rc=%d %.1fs: %s\n' "$label" "$k" "$rc" "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')" \
    "$(grep -m1 '^probe batch' "/tmp/max_batch.$$.log" || tail -n 2 "/tmp/max_batch.$$.log" | tr '\n' ' ')"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
    echo "max_batch $label: probe k=$k failed with exit $rc (not 3, out of memory): stopping" >&2
    exit 1
  fi
  return $((rc != 0))
}
left() { [ "$n" -lt "$max_probes" ] && [ "$(date +%s)" -lt "$deadline" ]; }
grow() { awk -v k="$1" -v f="$factor" 'BEGIN { n = int(k * f); print (n > k ? n : k + 1) }'; }
shrink() { awk -v k="$1" -v f="$factor" 'BEGIN { n = int(k / f); print (n < k ? n : k - 1) }'; }
# Bracket.
while left; do
  if probe "$@"; then
    lo=$k
    [ "$hi" -gt 0 ] && break
    k=$(grow "$k")
  else
    hi=$k
    [ "$lo" -gt 0 ] && break
    k=$(shrink "$k")
    [ "$k" -lt 1 ] && break
  fi
done
# Bisect.
while [ "$lo" -gt 0 ] && [ "$hi" -gt $((lo + 1)) ] && left; do
  k=$(((lo + hi) / 2))
  if probe "$@"; then lo=$k; else hi=$k; fi
done
resolved=0
[ "$lo" -gt 0 ] && [ "$hi" -eq $((lo + 1)) ] && resolved=1
echo "max_batch $label fits_k=$lo fails_k=$hi resolved=$resolved probes=$n seconds=$(($(date +%s) - start))"
rm -f "/tmp/max_batch.$$.log"
