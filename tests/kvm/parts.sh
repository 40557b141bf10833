#!/bin/sh
# The KVM suite's parts, each printing its own plan, against one capsule,
# sharing one templates directory (CAPSULE_TEST_TEMPLATES: in the L1
# guest a template takes half a minute to build). Run where KVM works
# (tests/integration/test-kvm.sh: on the host or in L1).
#   tests/kvm/parts.sh BUILD/capsule TEMPLATES
set -u
here=$(cd "$(dirname "$0")" && pwd)
for part in suite.sh check-net.sh check-serve.py; do
	if [ -x "$here/$part" ]; then
		CAPSULE_TEST_TEMPLATES=$2 "$here/$part" "$1" --expect-kvm
	else
		echo "1..1"
		echo "not ok 1 - tests/kvm/$part is missing or not executable"
	fi
done
