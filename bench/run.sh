#!/bin/sh
# make bench: figures measured side by side in one run, each against a
# baseline measured in the same run, reported as medians and ratios.
set -eu
build=${1:-build}
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
capsule="$top/$build/capsule"
export CAPSULE_AGENT="$top/$build/capsule-agent"
runs=${BENCH_RUNS:-7}
execs=${BENCH_EXECS:-200}

now_ns() { date +%s%N; }
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# Make sure the initramfs is packed, then find the artefacts doctor names.
"$capsule" run -q -- true >/dev/null
kernel=$(readlink -f "${CAPSULE_KERNEL:-${CAPSULE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capsule}/vmlinux}")
initrd=$("$capsule" doctor | sed -n 's/^initramfs: *cached: //p')
accel=$("$capsule" doctor | sed -n 's/^accel: *\([a-z]*\).*/\1/p')
[ -n "$initrd" ] && [ -f "$kernel" ] || { echo "bench: kernel or initramfs missing; run make" >&2; exit 1; }
if [ "$accel" = kvm ]; then cpu=host; else cpu=max; fi

raw_boot() {
	qemu-system-x86_64 -M microvm,acpi=off -accel "$accel" -cpu "$cpu" -m 512 \
		-nodefaults -no-user-config -display none -no-reboot \
		-kernel "$kernel" -initrd "$initrd" \
		-append "console=ttyS0 panic=-1 reboot=t quiet capsule.poweroff" \
		-serial null
}

echo "bench: $runs cold runs each, alternating capsule and raw QEMU ($accel)..." >&2
: >/tmp/capsule-bench-a.$$
: >/tmp/capsule-bench-b.$$
i=0
while [ $i -lt "$runs" ]; do
	t=$(now_ns); "$capsule" run -q -- true; echo $(( $(now_ns) - t )) >>/tmp/capsule-bench-a.$$
	t=$(now_ns); raw_boot; echo $(( $(now_ns) - t )) >>/tmp/capsule-bench-b.$$
	i=$((i + 1))
done
cold=$(median </tmp/capsule-bench-a.$$)
raw=$(median </tmp/capsule-bench-b.$$)
rm -f /tmp/capsule-bench-a.$$ /tmp/capsule-bench-b.$$

echo "bench: $execs warm execs in one VM and $execs host fork+exec..." >&2
"$top/$build/bench/bench-exec" "$execs" >/tmp/capsule-bench-e.$$
host_p50=$(awk '$1 == "host_fork_exec" { print $2 }' /tmp/capsule-bench-e.$$)
host_p99=$(awk '$1 == "host_fork_exec" { print $3 }' /tmp/capsule-bench-e.$$)
vm_p50=$(awk '$1 == "vm_exec" { print $2 }' /tmp/capsule-bench-e.$$)
vm_p99=$(awk '$1 == "vm_exec" { print $3 }' /tmp/capsule-bench-e.$$)
rm -f /tmp/capsule-bench-e.$$

printf '\ncapsule bench: accel %s, %s, %d cold runs, %d warm execs\n\n' \
	"$accel" "$(qemu-system-x86_64 --version | head -1 | sed 's/QEMU emulator //')" "$runs" "$execs"
printf '%-44s %12s %12s %8s\n' "measure" "capsule" "baseline" "ratio"
printf '%-44s %12s %12s %8s\n' "--------------------------------------------" "------------" "------------" "--------"
awk -v c="$cold" -v r="$raw" 'BEGIN {
	printf "%-44s %10.0fms %10.0fms %7.2fx\n", "(a) capsule run -- true vs raw boot+poweroff", c / 1e6, r / 1e6, c / r }'
awk -v v="$vm_p50" -v h="$host_p50" 'BEGIN {
	printf "%-44s %10.0fus %10.0fus %7.1fx\n", "(b) warm exec `true` p50 vs host fork+exec", v, h, v / h }'
awk -v v="$vm_p99" -v h="$host_p99" 'BEGIN {
	printf "%-44s %10.0fus %10.0fus %7.1fx\n", "(b) warm exec `true` p99 vs host fork+exec", v, h, v / h }'
