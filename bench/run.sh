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

# (c) named sandboxes: restart of a stopped sandbox to its first result,
# against a fresh one-shot VM; (d) image conversion against mkfs.erofs.
bench_home=$(mktemp -d /tmp/capsule-bench.XXXXXX)
trap 'for s in b durable; do CAPSULE_HOME="$bench_home/home" "$capsule" rm --force $s >/dev/null 2>&1 || true; done; rm -rf "$bench_home"' EXIT
export CAPSULE_HOME="$bench_home/home"
"$capsule" image build base >/dev/null 2>&1
"$capsule" create b >/dev/null
echo "bench: $runs restarts of a stopped sandbox, alternating with fresh runs..." >&2
: >"$bench_home/a"
: >"$bench_home/b"
i=0
while [ $i -lt "$runs" ]; do
	"$capsule" stop b
	t=$(now_ns); "$capsule" exec b -- true; echo $(( $(now_ns) - t )) >>"$bench_home/a"
	t=$(now_ns); "$capsule" run -q -- true; echo $(( $(now_ns) - t )) >>"$bench_home/b"
	i=$((i + 1))
done
"$capsule" rm --force b >/dev/null
restart=$(median <"$bench_home/a")
fresh=$(median <"$bench_home/b")

echo "bench: building the python image (debootstrap, about a minute)..." >&2
conv_runs=${BENCH_CONV_RUNS:-5}
if "$capsule" image build python >/dev/null 2>&1; then
	pyimg=$("$capsule" image inspect python | sed -n 's/^file: *//p')
	fsck.erofs --extract="$bench_home/tree" "$pyimg" >/dev/null 2>&1
	echo "bench: $conv_runs conversions of the python tree, alternating with mkfs.erofs..." >&2
	: >"$bench_home/c"
	: >"$bench_home/d"
	i=0
	while [ $i -lt "$conv_runs" ]; do
		"$capsule" image rm python-bench >/dev/null 2>&1 || true
		t=$(now_ns); "$capsule" image import "$bench_home/tree" --name python-bench >/dev/null 2>&1; echo $(( $(now_ns) - t )) >>"$bench_home/c"
		t=$(now_ns); mkfs.erofs --quiet -T0 "$bench_home/raw.erofs" "$bench_home/tree" >/dev/null 2>&1; echo $(( $(now_ns) - t )) >>"$bench_home/d"
		rm -f "$bench_home/raw.erofs"
		i=$((i + 1))
	done
	convert=$(median <"$bench_home/c")
	mkfs=$(median <"$bench_home/d")
else
	convert=0
	mkfs=0
fi
unset CAPSULE_HOME

# (e) public data: fingerprint of an unchanged 10000-file tree against a
# walk that stats every entry (du -s); projection build against cp -a.
echo "bench: a 10000-file tree: fingerprints and projection builds..." >&2
tree="$bench_home/pub"
d=0
while [ $d -lt 100 ]; do
	mkdir -p "$tree/d$d"
	f=0
	while [ $f -lt 100 ]; do
		head -c 1024 /dev/urandom >"$tree/d$d/f$f"
		f=$((f + 1))
	done
	d=$((d + 1))
done
: >"$bench_home/e"; : >"$bench_home/f"; : >"$bench_home/g"; : >"$bench_home/h"
i=0
while [ $i -lt "$runs" ]; do
	t=$(now_ns); "$capsule" source check "$tree" >/dev/null; echo $(( $(now_ns) - t )) >>"$bench_home/e"
	t=$(now_ns); du -s "$tree" >/dev/null; echo $(( $(now_ns) - t )) >>"$bench_home/f"
	i=$((i + 1))
done
i=0
while [ $i -lt "$conv_runs" ]; do
	rm -f "$bench_home/pub.erofs"; rm -rf "$bench_home/pub-copy"; sync
	t=$(now_ns); "$capsule" source build "$tree" "$bench_home/pub.erofs" >/dev/null; echo $(( $(now_ns) - t )) >>"$bench_home/g"
	t=$(now_ns); cp -a "$tree" "$bench_home/pub-copy"; echo $(( $(now_ns) - t )) >>"$bench_home/h"
	i=$((i + 1))
done
fp=$(median <"$bench_home/e")
du=$(median <"$bench_home/f")
pbuild=$(median <"$bench_home/g")
cpa=$(median <"$bench_home/h")

echo "bench: capsule serve: resume, restart, four identities at once, exec during another's refresh..." >&2
python3 "$top/bench/bench-serve.py" "$capsule" "$runs" >"$bench_home/serve"
echo "bench: capsule mcp: read_file of 100 KiB..." >&2
python3 "$top/bench/bench-mcp.py" "$capsule" 10 >>"$bench_home/serve"
serve_row() { awk -v k="$1" '$1 == k { print $'"$2"' }' "$bench_home/serve"; }

# (o) a full host: serve --capacity N with N identities paused, then calls
# spread over them (bench/bench-fullhost.py; about a minute and a half).
fullhost_n=${BENCH_FULLHOST_N:-64}
echo "bench: a full host: $fullhost_n identities paused, 3 rounds of calls over them, 4 at a time..." >&2
python3 "$top/bench/bench-fullhost.py" "$capsule" "$fullhost_n" >"$bench_home/fullhost" || : >"$bench_home/fullhost"
fh_row() { awk -v k="$1" '$1 == k { print $'"$2"' }' "$bench_home/fullhost"; }

# (p) idle cost: host memory held by N = 1, 10, 50 idle named sandboxes,
# paused and running, and host CPU per idle running one (N = 1, 10): with
# the template's RAM shared, with a per-VM copy (CAPSULE_SHARED_RAM=0),
# and "before" (shared, with the guest's old clock, jiffies, whose tick
# never stops: CAPSULE_GUEST_TSC=unstable), each 80 to 110 s on
# this 2-core host (bench/bench-density.py says what each figure is).
# Goal (issue 20): <= 20 MiB held per idle sandbox at N=50, <= 1 % of a
# core per idle running one.
echo "bench: idle cost: 1, 10 and 50 sandboxes paused and running, shared RAM, per-VM copy, before..." >&2
for dn_p in : -copy:CAPSULE_SHARED_RAM=0 -before:CAPSULE_GUEST_TSC=unstable; do
	dn_f=${dn_p%%:*}
	env $(echo "${dn_p#*:}" | tr : ' ') python3 "$top/bench/bench-density.py" "$capsule" "$top/$build/bench/bench-pause" \
		1 10 50 >"$bench_home/density$dn_f" 2>/dev/null || : >"$bench_home/density$dn_f"
done
# (q) KVM vs TCG: row (p)'s shared-RAM measurement under each accelerator,
# the host's own pass reused; under KVM in an L1 guest with nested KVM when
# this host has none (bench/bench-kvm.sh says what it chose: N = 1, 10, 50,
# about 5 minutes here).
"$top/bench/bench-kvm.sh" "$capsule" "$top/$build/bench/bench-pause" "$bench_home/density" >"$bench_home/kvm" || true
# dn FILE-SUFFIX FIELD KEY...: field FIELD of the line starting with KEY.
dn() { dn_f=$1 dn_c=$2; shift 2; awk -v k="$* " -v c="$dn_c" 'index($0, k) == 1 { print $c }' "$bench_home/density$dn_f"; }

# (h) templates: new sandbox to first result, restored against cold boot
# (in-process, medians), and against gVisor's `runsc do true`.
echo "bench: new sandboxes: template restore, cold boot, each with and without the jail; runsc do true..." >&2
"$top/$build/bench/bench-start" 15 >"$bench_home/start"
start_row() { awk -v k="$1" '$1 == k { print $2 }' "$bench_home/start"; }
# (i) the jail's cost: bench-start also ran each with the jail off (a
# debug setting), interleaved.
nojail_row() { start_row "$1_nojail"; }
# ... and per process, teardown included: `capsule run -- true`, alternating.
: >"$bench_home/run-jail"; : >"$bench_home/run-nojail"
i=0
while [ $i -lt 15 ]; do
	t=$(now_ns); "$capsule" run -q -- true >/dev/null 2>&1; echo $(( $(now_ns) - t )) >>"$bench_home/run-jail"
	t=$(now_ns); CAPSULE_JAIL=0 "$capsule" run -q -- true >/dev/null 2>&1; echo $(( $(now_ns) - t )) >>"$bench_home/run-nojail"
	i=$((i + 1))
done
run_jail=$(median <"$bench_home/run-jail")
run_nojail=$(median <"$bench_home/run-nojail")
: >"$bench_home/runsc"
i=0
while [ $i -lt 10 ]; do
	t=$(now_ns); runsc --network=none do true >/dev/null 2>&1; echo $(( $(now_ns) - t )) >>"$bench_home/runsc"
	i=$((i + 1))
done
runsc_ms=$(median <"$bench_home/runsc" | awk '{ print $1 / 1e6 }')
# ... and `capsule run -- true` taking a spare of `capsule spares`: each
# run timed once a spare is ready (the holder's log says so), the whole
# process as for runsc; a run that did not take one counts as missed.
echo "bench: capsule run -- true with a spare of capsule spares..." >&2
"$capsule" spares --count 1 >/dev/null 2>"$bench_home/spares.log" &
spares_pid=$!
: >"$bench_home/run-spare"
spare_missed=0
i=0
while [ $i -lt 15 ]; do
	w=0
	while [ "$(grep -c "spare ready" "$bench_home/spares.log")" -le $i ] && [ $w -lt 600 ]; do sleep 0.1; w=$((w + 1)); done
	t=$(now_ns); "$capsule" run -q -v -- true >/dev/null 2>"$bench_home/run-spare.err"; e=$(now_ns)
	if grep -q "a spare of" "$bench_home/run-spare.err"; then echo $(( e - t )) >>"$bench_home/run-spare"
	else spare_missed=$((spare_missed + 1)); fi
	i=$((i + 1))
done
kill -TERM "$spares_pid" 2>/dev/null; wait "$spares_pid" 2>/dev/null
run_spare=$(median <"$bench_home/run-spare" 2>/dev/null)

# (j) the network under a policy: the same client through the policy
# process and from the host's namespace; a new sandbox with and without
# a NIC (bench/bench-net.sh builds its own fake internet).
# (k) a project in and out of a sandbox, on the same 10000-file tree.
echo "bench: workspace: create with a 10000-file project, diff, cp of 100 MiB in and out..." >&2
"$top/bench/bench-workspace.sh" "$capsule" "$tree" "$conv_runs" >"$bench_home/ws"
ws_row() { awk -v k="$1" '$1 == k { print $'"$2"' }' "$bench_home/ws"; }

echo "bench: images by reference: pull from a local registry vs skopeo copy alone, prepare of a prepared home..." >&2
"$top/bench/bench-pull.sh" "$capsule" "$conv_runs" >"$bench_home/pull"
pl_row() { awk -v k="$1" '$1 == k { print $'"$2"' }' "$bench_home/pull"; }

echo "bench: OCI runtime: podman run --rm true with capsule-oci, runc and runsc..." >&2
"$top/bench/bench-oci.sh" "$capsule" "$runs" >"$bench_home/oci"
oci_row() { awk -v k="$1" '$1 == k { print $'"$2"' }' "$bench_home/oci"; }

# (r) Kubernetes pods through containerd's CRI: RunPodSandbox +
# CreateContainer + StartContainer to the container's first output, and
# host memory held per idle pod, BENCH_CRI_RUNTIME (capsule) against
# BENCH_CRI_BASELINE (runc) in the same run (bench/bench-cri.sh).
echo "bench: CRI: pod to first output and memory per idle pod, ${BENCH_CRI_RUNTIME:-capsule} vs ${BENCH_CRI_BASELINE:-runc}..." >&2
"$top/bench/bench-cri.sh" "$capsule" "$runs" >"$bench_home/cri"
cri_row() { awk -v k="$1" '$1 == k { print $'"$2"' }' "$bench_home/cri"; }

# (s) snapshots and forks: fork latency (N = 1, 8) against fresh
# sandboxes, memory held by 8 children against 8 fresh ones, a snapshot
# and a resume from one against a cold boot (bench/bench-fork.sh).
echo "bench: snapshots and forks: fork N=1 and 8 vs fresh, held memory, snapshot and resume vs cold boot..." >&2
"$top/bench/bench-fork.sh" "$capsule" "$runs" >"$bench_home/fork" || : >"$bench_home/fork"
fk_row() { awk -v k="$1" '$1 == k { print $'"$2"' }' "$bench_home/fork"; }

# (t) TCG's translation buffer per image class: 16 and 32 MiB against the
# default 128, its resident pages and the class's steady workload time
# (bench/bench-tb.sh; CAPSULE_TCG_TB_MIB sets it).
echo "bench: translation buffer sizes per image class (base, python, a compiler)..." >&2
"$top/bench/bench-tb.sh" "$capsule" >"$bench_home/tb" || : >"$bench_home/tb"
tb_row() { awk -v c="$1" -v m="$2" '$1 == "tb" && $2 == c && $3 == m { print $'"$3"' }' "$bench_home/tb"; }

echo "bench: network: connect+first byte, 10 MB downloads, start with a NIC..." >&2
"$top/bench/bench-net.sh" "$capsule" "$runs" >"$bench_home/net"
net_row() { awk -v k="$1" '$1 == k { print $'"$2"' }' "$bench_home/net"; }

# (n) durable results: warm exec in a named sandbox (through its shim) of
# `true` and of a 4 KiB write to /work, each flushed before its end (the
# default) and with --no-sync, interleaved; `true` must not pay for a flush.
durable_execs=${BENCH_DURABLE_EXECS:-300}
echo "bench: durable results: $durable_execs each of true and a 4 KiB write, flushed and --no-sync..." >&2
if CAPSULE_HOME="$bench_home/home" "$capsule" create durable >/dev/null &&
   CAPSULE_HOME="$bench_home/home" "$capsule" start durable >/dev/null &&
   CAPSULE_HOME="$bench_home/home" "$top/$build/bench/bench-durable" durable "$durable_execs" >"$bench_home/durable"; then
	:
else
	: >"$bench_home/durable"
fi
CAPSULE_HOME="$bench_home/home" "$capsule" rm --force durable >/dev/null 2>&1 || true
du_row() { awk -v k="$1" '$1 == k { print $'"$2"' }' "$bench_home/durable"; }

printf '\ncapsule bench: accel %s, %s, %d cold runs, %d warm execs\n\n' \
	"$accel" "$(qemu-system-x86_64 --version | head -1 | sed 's/QEMU emulator //')" "$runs" "$execs"
printf '%-59s %12s %12s %8s\n' "measure" "capsule" "baseline" "ratio"
printf '%-59s %12s %12s %8s\n' "-----------------------------------------------------------" "------------" "------------" "--------"
awk -v c="$cold" -v r="$raw" 'BEGIN {
	printf "%-59s %10.0fms %10.0fms %7.2fx\n", "(a) capsule run -- true vs raw boot+poweroff", c / 1e6, r / 1e6, c / r }'
awk -v v="$vm_p50" -v h="$host_p50" 'BEGIN {
	printf "%-59s %10.0fus %10.0fus %7.1fx\n", "(b) warm exec `true` p50 vs host fork+exec", v, h, v / h }'
awk -v v="$vm_p99" -v h="$host_p99" 'BEGIN {
	printf "%-59s %10.0fus %10.0fus %7.1fx\n", "(b) warm exec `true` p99 vs host fork+exec", v, h, v / h }'
awk -v a="$restart" -v b="$fresh" 'BEGIN {
	printf "%-59s %10.0fms %10.0fms %7.2fx\n", "(c) restart stopped sandbox+exec vs run true", a / 1e6, b / 1e6, a / b }'
awk -v a="$convert" -v b="$mkfs" 'BEGIN {
	if (b > 0) printf "%-59s %10.0fms %10.0fms %7.2fx\n", "(d) python image import vs mkfs.erofs alone", a / 1e6, b / 1e6, a / b
	else printf "%-59s %12s %12s %8s\n", "(d) python image import vs mkfs.erofs alone", "failed", "-", "-" }'
awk -v a="$fp" -v b="$du" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.2fx\n", "(e) fingerprint, 10000 files, vs du -s", a / 1e6, b / 1e6, a / b }'
awk -v a="$pbuild" -v b="$cpa" 'BEGIN {
	printf "%-59s %10.0fms %10.0fms %7.2fx\n", "(e) projection build, 10000 files, vs cp -a", a / 1e6, b / 1e6, a / b }'
awk -v a="$(serve_row resume 2)" -v b="$(serve_row resume 3)" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.2fx\n", "(f) serve: resume from pause vs warm call", a, b, a / b }'
awk -v a="$(serve_row restart 2)" -v b="$(serve_row restart 3)" 'BEGIN {
	printf "%-59s %10.0fms %10.0fms %7.2fx\n", "(f) serve: restart stopped vs fresh identity", a, b, a / b }'
awk -v a="$(start_row restore)" -v b="$(start_row cold)" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.3fx\n", "(h) new sandbox to result: template vs cold", a, b, a / b }'
awk -v a="$(start_row restore)" -v b="$runsc_ms" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.3fx\n", "(h) new sandbox: template vs runsc do true", a, b, a / b }'
awk -v a="${run_spare:-0}" -v b="$runsc_ms" -v m="$spare_missed" 'BEGIN {
	l = "(h) capsule run -- true: with a spare vs runsc do true"
	if (m > 0) l = l " (" m " missed)"
	if (a > 0) printf "%-59s %10.1fms %10.1fms %7.3fx\n", l, a / 1e6, b, a / 1e6 / b
	else printf "%-59s %12s %10.1fms %8s\n", l, "failed", b, "-" }'
awk -v a="${run_spare:-0}" -v b="$run_jail" 'BEGIN {
	if (a > 0) printf "%-59s %10.1fms %10.1fms %7.3fx\n", "(h) capsule run -- true: with a spare vs without", a / 1e6, b / 1e6, a / b }'
awk -v a="$(serve_row spare 2)" -v b="$runsc_ms" 'BEGIN {
	if (a > 0) printf "%-59s %10.1fms %10.1fms %7.3fx\n", "(h) serve: new identity to result, spare vs runsc do true", a, b, a / b
	else printf "%-59s %12s %10.1fms %8s\n", "(h) serve: new identity to result, spare vs runsc do true", "failed", b, "-" }'
awk -v a="$(serve_row spare 2)" -v b="$(serve_row spare 3)" 'BEGIN {
	if (a > 0) printf "%-59s %10.1fms %10.1fms %7.3fx\n", "(h) serve: new identity to result, spare vs no spare", a, b, a / b }'
# Where a restore's time goes (bench-start's medians, ms): the first exec
# is TCG translating the guest's kernel paths for the first time.
awk '$1 == "phases_restore" { printf "%-59s %s\n", "(h) restore phases, medians (ms):", substr($0, 16) }' "$bench_home/start"
awk -v a="$(dn '' 4 held running 10)" -v b="$(start_row pss_restore)" 'BEGIN {
	m = "(h) idle restored VM: held (p, N=10 running) vs QEMU PSS"
	if (a > 0) printf "%-59s %8.1fMiB %8.1fMiB %7.2fx\n", m, a / 1024, b / 1024, a / b
	else printf "%-59s %12s %8.1fMiB %8s\n", m, "failed", b / 1024, "-" }'
awk -v a="$(start_row restore)" -v b="$(nojail_row restore)" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.2fx\n", "(i) new sandbox (template): jail vs no jail", a, b, a / b }'
awk -v a="$(start_row cold)" -v b="$(nojail_row cold)" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.2fx\n", "(i) new sandbox (cold boot): jail vs no jail", a, b, a / b }'
awk -v a="$run_jail" -v b="$run_nojail" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.2fx\n", "(i) capsule run -- true: jail vs no jail", a / 1e6, b / 1e6, a / b }'
awk -v a="$(serve_row throughput 2)" -v b="$(serve_row throughput 3)" 'BEGIN {
	printf "%-59s %8.0f/s %10.0f/s %7.2fx\n", "(f) serve: 4 identities at once vs 1, calls", a, b, a / b }'
awk -v a="$(serve_row refresh 2)" -v b="$(serve_row refresh 3)" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.2fx\n", "(f) serve: exec while another refreshes 10000 files vs idle", a, b, a / b }'
awk -v a="$(serve_row read_file 2)" -v b="$(serve_row read_file 3)" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.2fx\n", "(g) mcp read_file 100 KiB vs capsule exec cat", a, b, a / b }'
awk -v a="$(net_row connect 2)" -v b="$(net_row connect 3)" 'BEGIN {
	printf "%-59s %10.0fus %10.0fus %7.2fx\n", "(j) TCP connect+first byte: via policy vs host ns", a, b, a / b }'
awk -v a="$(net_row fetch 2)" -v b="$(net_row fetch 3)" 'BEGIN {
	printf "%-59s %8.1fMB/s %8.1fMB/s %7.2fx\n", "(j) 10 MB download: via policy vs host ns", a, b, a / b }'
awk -v a="$(net_row guest_fetch 2)" -v b="$(net_row guest_fetch 3)" 'BEGIN {
	printf "%-59s %8.1fMB/s %8.1fMB/s %7.2fx\n", "(j) 10 MB wget: in the guest (exec incl.) vs host ns", a, b, a / b }'
awk -v a="$(net_row start 2)" -v b="$(net_row start 3)" 'BEGIN {
	printf "%-59s %10.0fms %10.0fms %7.2fx\n", "(j) capsule run -- true: with a NIC vs without", a / 1e6, b / 1e6, a / b }'
awk -v a="$(net_row https 2)" -v b="$(net_row https 3)" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.2fx\n", "(j) HTTPS request: intercepted (secret) vs passed through", a, b, a / b }'
awk -v a="$(net_row https 3)" -v b="$(net_row https 4)" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.2fx\n", "(j) HTTPS request: passed through vs from the host", a, b, a / b }'
awk -v a="$(ws_row create 2)" -v b="$(ws_row create 3)" 'BEGIN {
	printf "%-59s %10.0fms %10.0fms %7.2fx\n", "(k) create --workspace, 10000 files, vs cp -a", a / 1e6, b / 1e6, a / b }'
awk -v a="$(ws_row diff 2)" -v b="$(ws_row diff 3)" 'BEGIN {
	printf "%-59s %10.0fms %10.0fms %7.2fx\n", "(k) diff, 10 changed in 10000 files, vs host diff -rq", a / 1e6, b / 1e6, a / b }'
awk -v a="$(ws_row cp_in 2)" -v b="$(ws_row cp_in 3)" 'BEGIN {
	printf "%-59s %10.0fms %10.0fms %7.2fx\n", "(k) capsule cp 100 MiB in vs cat | cat on the host", a / 1e6, b / 1e6, a / b }'
awk -v a="$(ws_row cp_out 2)" -v b="$(ws_row cp_out 3)" 'BEGIN {
	printf "%-59s %10.0fms %10.0fms %7.2fx\n", "(k) capsule cp 100 MiB out vs cat | cat on the host", a / 1e6, b / 1e6, a / b }'
awk -v a="$(pl_row pull 2)" -v b="$(pl_row pull 3)" 'BEGIN {
	printf "%-59s %10.0fms %10.0fms %7.2fx\n", "(l) image pull (python3, local registry) vs skopeo copy", a / 1e6, b / 1e6, a / b }'
awk -v a="$(pl_row prepare 2)" -v b="$(pl_row prepare 3)" 'BEGIN {
	printf "%-59s %10.1fms %10.1fms %7.2fx\n", "(l) prepare of a prepared home vs capsule --version", a / 1e6, b / 1e6, a / b }'
for k in runc runsc; do
	awk -v k="$k" -v a="$(oci_row $k 2)" -v b="$(oci_row $k 3)" 'BEGIN {
		m = "(m) podman run --rm true: capsule-oci vs " k
		if (a > 0 && b > 0) printf "%-59s %10.0fms %10.0fms %7.2fx\n", m, a / 1e6, b / 1e6, a / b
		else printf "%-59s %12s %12s %8s\n", m, (a > 0) ? sprintf("%10.0fms", a / 1e6) : "failed", (b > 0) ? sprintf("%10.0fms", b / 1e6) : "failed", "-" }'
done
for w in write true; do
	for q in 2:p50 3:p99; do
		awk -v w="$w" -v q="${q#*:}" -v a="$(du_row ${w}_durable ${q%:*})" -v b="$(du_row ${w}_nosync ${q%:*})" 'BEGIN {
			m = "(n) exec " ((w == "write") ? "writing 4 KiB" : "`true`") " " q ": durable vs --no-sync"
			if (a > 0 && b > 0) printf "%-59s %10.1fms %10.1fms %7.2fx\n", m, a / 1000, b / 1000, a / b
			else printf "%-59s %12s %12s %8s\n", m, "failed", "-", "-" }'
	done
done
awk -v s="$(du_row write_durable 5)" -v a="$(du_row write_durable 2)" -v ft="$(du_row true_durable 4)" -v fw="$(du_row write_durable 4)" -v n="$durable_execs" 'BEGIN {
	if (a > 0) {
		printf "%-59s %10.0fms %10.1fms %7.2fx\n", "(n) 4 KiB write: flush (EXIT sync_ms p50) vs its exec p50", s, a / 1000, s / (a / 1000)
		printf "%-59s %12s %12s %8s\n", "(n) ends that flushed: `true` vs 4 KiB write (durable)", ft "/" n, fw "/" n, "-"
	} }'
# (p): "held" is what the host holds for them, attributed: their jail
# cgroups' anonymous + shmem + kernel memory, the shims' and RAM holders'
# proportional anonymous memory, the template's memfd once; "before" the
# same with the guest's old clock (CAPSULE_GUEST_TSC=unstable). Checks:
# "charged" counts the same by the kernel's charges (a cgroup of the
# bench's own for the shims and holder), "released" is the AnonPages +
# Shmem of /proc/meminfo that removing them released (no kernel memory;
# noisy on a busy host).
dn_mib() {	# label a b: a row of two KiB figures, "failed" for a missing one
	awk -v m="$1" -v a="$2" -v b="$3" 'BEGIN {
		if (a > 0 && b > 0) printf "%-59s %8.1fMiB %8.1fMiB %7.2fx\n", m, a / 1024, b / 1024, a / b
		else printf "%-59s %12s %12s %8s\n", m, (a > 0) ? sprintf("%8.1fMiB", a / 1024) : "failed", (b > 0) ? sprintf("%8.1fMiB", b / 1024) : "failed", "-" }'
}
for n in 1 10 50; do
	for st in paused running; do
		dn_mib "(p) held per $st sandbox, N=$n: shared vs per-VM RAM" "$(dn '' 4 held $st $n)" "$(dn -copy 4 held $st $n)"
		dn_mib "(p) held per $st sandbox, N=$n: today vs before" "$(dn '' 4 held $st $n)" "$(dn -before 4 held $st $n)"
	done
	dn_mib "(p) check, paused N=$n: kernel's charges vs held" "$(dn '' 4 charged paused $n)" "$(dn '' 4 held paused $n)"
	dn_mib "(p) check, paused N=$n: meminfo released vs held-kernel" "$(dn '' 3 released $n)" \
		"$(awk -v a="$(dn '' 4 held paused $n)" -v k="$(dn '' 6 parts paused $n)" 'BEGIN { if (a != "") print a - k }')"
done
for n in 1 10; do
	awk -v n="$n" -v a="$(dn '' 3 cpu $n)" -v s="$(dn '' 4 cpu $n)" -v b="$(dn -before 3 cpu $n)" -v t="$(dn -before 4 cpu $n)" \
		-v ca="$(dn '' 2 clock)" -v cb="$(dn -before 2 clock)" 'BEGIN {
		sub(/^refined-/, "", ca); sub(/^refined-/, "", cb)
		m = "(p) CPU per idle running sandbox, N=" n ": " ca " vs " cb
		if (a != "" && b != "") printf "%-59s %11.2f%% %11.2f%% %7.2fx\n", m, a + s, b + t, (b + t > 0) ? (a + s) / (b + t) : 0
		else printf "%-59s %12s %12s %8s\n", m, (a != "") ? sprintf("%11.2f%%", a + s) : "failed", (b != "") ? sprintf("%11.2f%%", b + t) : "failed", "-" }'
done
cri_h=${BENCH_CRI_RUNTIME:-capsule} cri_b=${BENCH_CRI_BASELINE:-runc}
awk -v a="$(cri_row first_output 2)" -v b="$(cri_row first_output 3)" -v h="$cri_h" -v r="$cri_b" 'BEGIN {
	m = "(r) CRI pod (RunPodSandbox..Start) to output: " h " vs " r
	if (a > 0 && b > 0) printf "%-59s %10.0fms %10.0fms %7.2fx\n", m, a / 1e6, b / 1e6, a / b
	else printf "%-59s %12s %12s %8s\n", m, (a > 0) ? sprintf("%10.0fms", a / 1e6) : "failed", (b > 0) ? sprintf("%10.0fms", b / 1e6) : "failed", "-" }'
dn_mib "(r) CRI: held per idle pod, N=${BENCH_CRI_PODS:-3}: $cri_h vs $cri_b" \
	"$(cri_row pod_memory 2)" "$(cri_row pod_memory 3)"
for r in "fork1:(s) fork, 1 child, to running vs create+start fresh" \
	 "fork8:(s) fork --count 8 vs 8 fresh made and started" \
	 "snapshot:(s) snapshot (save, disks, seal) vs cold boot to running" \
	 "resume:(s) start from a snapshot vs cold boot to running"; do
	awk -v m="${r#*:}" -v a="$(fk_row "${r%%:*}" 2)" -v b="$(fk_row "${r%%:*}" 3)" 'BEGIN {
		if (a > 0 && b > 0) printf "%-59s %10.0fms %10.0fms %7.2fx\n", m, a, b, a / b
		else printf "%-59s %12s %12s %8s\n", m, "failed", "-", "-" }'
done
dn_mib "(s) held by 8 idle children vs 8 fresh sandboxes" "$(fk_row held8 2)" "$(fk_row held8 3)"
for cls in base python cc; do
	for mib in 16 32; do
		dn_mib "(t) $cls: TB resident, tb-size $mib vs 128 MiB" "$(tb_row $cls $mib 4)" "$(tb_row $cls 128 4)"
		awk -v m="(t) $cls: steady workload, tb-size $mib vs 128 MiB" -v a="$(tb_row $cls $mib 7)" -v b="$(tb_row $cls 128 7)" 'BEGIN {
			if (a > 0 && b > 0) printf "%-59s %10.0fms %10.0fms %7.2fx\n", m, a, b, a / b
			else printf "%-59s %12s %12s %8s\n", m, "failed", "-", "-" }'
	done
done
cat "$bench_home/kvm"
if [ -s "$bench_home/fullhost" ]; then
	awk -v a="$(fh_row answered 2)" -v b="$(fh_row answered 3)" -v n="$fullhost_n" 'BEGIN {
		printf "%-59s %12s %12s %8s\n", "(o) full host, " n " identities: calls answered / sent", a "/" b, "-", "-" }'
	for q in 2:p50 3:p99; do
		awk -v q="${q#*:}" -v a="$(fh_row resume_${q#*:} 2)" -v b="$(fh_row resume_${q#*:} 3)" 'BEGIN {
			printf "%-59s %10.1fms %10.1fms %7.2fx\n", "(o) full host: call " q ", to a paused VM vs a running one", a, b, a / b }'
	done
	awk -v a="$(fh_row create_p50 2)" -v b="$(fh_row create_p50 3)" 'BEGIN {
		printf "%-59s %10.0fms %10.1fms %7.1fx\n", "(o) full host: first call (new sandbox) p50 vs running p50", a, b, a / b }'
	awk -v a="$(fh_row mem_total 2)" -v b="$(fh_row mem_total 3)" -v n="$fullhost_n" 'BEGIN {
		printf "%-59s %8.0fMiB %8.0fMiB %7.3fx\n", "(o) full host: held at " n " paused (anon+shmem) vs host RAM", a / 1024, b / 1024, a / b }'
	awk -v a="$(fh_row mem_per_vm 2)" -v b="$(fh_row mem_per_vm 3)" 'BEGIN {
		if (b > 0) printf "%-59s %8.1fMiB %8.1fMiB %7.2fx\n", "(o) full host: held per paused VM vs its jail cgroup", a / 1024, b / 1024, a / b
		else printf "%-59s %8.1fMiB %12s %8s\n", "(o) full host: held per paused VM vs its jail cgroup", a / 1024, "-", "-" }'
	awk -v a="$(fh_row paused_cpu 2)" -v n="$(fh_row paused_cpu 3)" 'BEGIN {
		printf "%-59s %11.2f%% %12s %8s\n", "(o) full host: CPU of " n " paused QEMUs + serve, % of a core", a, "-", "-" }'
	awk -v l="$(fh_row lost 2)" -v n="$(fh_row lost 3)" -v q="$(fh_row qemu 2)" -v r="$(fh_row qemu 3)" 'BEGIN {
		printf "%-59s %12s %12s %8s\n", "(o) full host: VMs lost; QEMU processes vs resident VMs", l "/" n " lost", q " vs " r, "-" }'
	awk -v a="$(fh_row shutdown 2)" -v b="$(fh_row shutdown 3)" -v n="$fullhost_n" 'BEGIN {
		printf "%-59s %10.0fms %12s %8s\n", "(o) full host: SIGTERM to exit with " n " VMs; QEMU left", a, b " left", "-" }'
else
	printf '%-59s %12s %12s %8s\n' "(o) full host: $fullhost_n identities" "failed" "-" "-"
fi
